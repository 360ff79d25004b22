"""Malformed and hostile HTTP over raw sockets: every case gets an answer (or a closed connection) in bounded
time, errors have OpenAI's JSON shape, and /health answers right after each."""

import json
import socket
import time

import pytest

READ_TIMEOUT = 2  # the suite's server runs with --read-timeout 2


def exchange(server, data, wait=READ_TIMEOUT + 6, half_close=False, pause_after=None):
    """Sends raw bytes; returns (status or None, body bytes, seconds). Reads until the response is complete
    (Content-Length) or the server closes the connection."""
    t0 = time.time()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=wait)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            if sep:
                length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
    finally:
        s.close()
    status = None
    if buf.startswith(b"HTTP/1.1 "):
        status = int(buf[9:12])
    body = buf.partition(b"\r\n\r\n")[2]
    return status, body, time.time() - t0


def post(path, body, extra_headers=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + extra_headers +
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def assert_openai_error(body, code=None):
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if code:
        assert err["code"] == code


@pytest.fixture(autouse=True)
def healthy_after(server):
    yield
    status, body = server.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


CHAT = b"/v1/chat/completions"


@pytest.mark.parametrize(
    "name, data, status, code",
    [
        ("malformed json", post(CHAT, b'{"model": "m", "messages": ['), 400, None),
        ("not json at all", post(CHAT, b"hello there"), 400, None),
        ("json string", post(CHAT, b'"just a string"'), 400, None),
        ("invalid utf-8", post(CHAT, b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'), 400, None),
        ("nul bytes", post(CHAT, b'{"model":"m",\x00\x00}'), 400, None),
        ("deep nesting", post(CHAT, b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"), 400, None),
        ("empty body", post(CHAT, b""), 400, None),
        ("bad request line", b"GARBAGE\r\n\r\n", 400, "bad_http_request"),
        ("unknown method", b"BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_http_request"),
        ("wrong method", b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed"),
        ("unknown route", b"GET /v2/everything HTTP/1.1\r\nHost: x\r\n\r\n", 404, "unknown_url"),
        ("oversized header line", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", 400,
         "bad_http_request"),
        ("oversized url", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
        ("bad chunked body", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
         400, "bad_http_request"),
        ("content-length not a number", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
         400, None),
        ("negative content-length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
         400, "bad_http_request"),
        ("header line without a colon", b"GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400,
         "bad_http_request"),
        ("number out of range", post(CHAT, b'{"model": "m", "messages": [], "x": 1e400}'), 400, None),
    ],
)
def test_malformed_requests(server, name, data, status, code):
    got, body, seconds = exchange(server, data)
    assert got == status, (name, body[:300])
    assert_openai_error(body, code)
    assert seconds < READ_TIMEOUT + 4


def test_partial_body_then_close(server):
    data = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"model\""
    got, body, seconds = exchange(server, data, half_close=True)
    assert got in (None, 400)
    assert seconds < READ_TIMEOUT + 4


def test_stalled_body_is_dropped_after_the_read_timeout(server):
    data = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"model\""
    got, body, seconds = exchange(server, data)
    assert got in (None, 400)
    assert READ_TIMEOUT - 0.5 <= seconds < READ_TIMEOUT + 4


def test_stalled_headers_are_dropped_after_the_read_timeout(server):
    got, body, seconds = exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert got in (None, 400)
    assert seconds < READ_TIMEOUT + 4


def test_declared_body_over_the_limit_is_413(server):
    data = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n{}"
    got, body, seconds = exchange(server, data)
    assert got == 413
    assert_openai_error(body, "payload_too_large")


def test_many_stalled_connections_do_not_block_others(server):
    stalled = []
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        stalled.append(s)
    try:
        t0 = time.time()
        assert server.get("/health")[0] == 200
        assert time.time() - t0 < 3.0
    finally:
        for s in stalled:
            s.close()


def test_bad_input_is_answered_at_once(server):
    """Malformed framing gets its 400 right away, not after the read timeout."""
    got, body, seconds = exchange(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
    assert got == 400
    assert seconds < READ_TIMEOUT


def test_expect_100_continue_is_not_granted_for_a_body_over_the_limit(server):
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: 400000000\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        s.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    assert buf.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in buf


def test_response_format_type_must_be_a_string(server, model):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "response_format": {"type": 1}}).encode()
    got, reply, _ = exchange(server, post(CHAT, body))
    assert got == 400
    assert_openai_error(reply, "invalid_type")


def test_echoed_input_is_truncated_and_logs_stay_one_line(server, model):
    huge = "m" * (20 << 20)
    body = json.dumps({"model": huge, "messages": [{"role": "user", "content": "hi"}]}).encode()
    got, reply, _ = exchange(server, post(CHAT, body))
    assert got == 404
    assert len(reply) < 2000
    assert_openai_error(reply, "model_not_found")
    forged = "user\nE 2026-12-01T00:00:00.000Z forged line"
    body = json.dumps({"model": model, "messages": [{"role": forged, "content": "hi"}]}).encode()
    got, reply, _ = exchange(server, post(CHAT, body))
    assert got == 400
    log = server.log_text()
    assert "forged line" in log
    assert not any(line.startswith("E 2026-12-01T00:00:00.000Z forged") for line in log.splitlines())
    assert all(len(line) < 10_000 for line in log.splitlines())
