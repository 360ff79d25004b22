"""API keys, health and metrics endpoints, keep-alive comments and a clean shutdown, on servers of their own."""

import json
import socket
import threading
import time

import openai
import pytest

from conftest import FAKE, Server


def test_api_key_is_enforced():
    s = Server("--api-key", "sekrit-key")
    try:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.models.list()
        assert info.value.code == "invalid_api_key"
        status, body = s.get("/v1/models")
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit-key", max_retries=0)
        assert good.models.list().data
        assert s.get("/health")[0] == 200  # probes need no key
    finally:
        assert s.stop() == 0


def test_metrics_text_format(server, client, model):
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    status, text = server.get("/metrics")
    assert status == 200
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    for name in ["puredrive_http_requests_total", "puredrive_prompt_tokens_total", "puredrive_generation_tokens_total",
                 "puredrive_decode_tokens_per_second", "puredrive_mtp_tokens_per_step", "puredrive_queue_length",
                 "puredrive_errors_total", "puredrive_generations_total"]:
        assert name in names
    m = server.metrics()
    assert m['puredrive_http_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1


@pytest.mark.skipif(not FAKE, reason="needs the fake engine's prefill delay")
def test_keep_alive_comments_during_a_long_prefill():
    s = Server("--fake-prefill-delay-ms", "1200")
    try:
        body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                           "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        data = b""
        while b"data: [DONE]" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        sock.close()
        assert b": keep-alive\n\n" in data
        assert data.index(b": keep-alive") < data.index(b'"finish_reason":"length"')
    finally:
        assert s.stop() == 0


@pytest.mark.skipif(not FAKE, reason="needs the fake engine's token delay")
def test_shutdown_during_a_stream_is_clean():
    s = Server("--fake-token-delay-ms", "20")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    got = []

    def consume():
        try:
            for chunk in client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "x" * 50}],
                                                        max_tokens=500, stream=True):
                if chunk.choices:
                    got.append(chunk.choices[0].delta.content or "")
        except Exception as e:  # noqa: BLE001 - the stream may end with an error event
            got.append(e)

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.time() + 10
    while len(got) < 3 and time.time() < deadline:
        time.sleep(0.01)
    t0 = time.time()
    assert s.stop() == 0
    assert time.time() - t0 < 9  # idle keep-alive connections may hold the exit up to 5 s
    t.join(10)
    assert not t.is_alive()
