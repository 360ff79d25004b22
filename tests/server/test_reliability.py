"""Reliability under attack (issue 19): slow-header clients do not starve others, huge chunked bodies are
refused without memory growth, huge prompts are refused before tokenizing, model files that are not regular
files are refused, a signal ends `serve` while it loads, and /metrics accounts for every generation."""

import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time

import openai
import pytest

from conftest import BIN, CTX_SIZE, FAKE, Server

# Under AddressSanitizer freed memory waits in its quarantine (256 MB by default) instead of going back to the
# system, so whether memory returns after a request is checked only in plain builds.
SANITIZED = os.environ.get("PD_SANITIZED") == "1"


def kept_mib(pid, before_kib, limit_mib):
    """RSS above `before_kib` once freed memory shows: the kernel updates a process's RSS counters lazily,
    so a drop may take a moment to appear."""
    deadline = time.time() + 10
    while True:
        kept = (rss_kib(pid) - before_kib) / 1024
        if kept < limit_mib or time.time() > deadline:
            return kept
        time.sleep(0.1)


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def chat_body(model, content="hi", max_tokens=4):
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()


def request(port, data, timeout=30):
    """One raw request on a fresh connection; returns (status, body bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        buf = b""
        while True:
            head, sep, body = buf.partition(b"\r\n\r\n")
            if sep:
                lengths = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if lengths and len(body) >= lengths[0]:
                    break
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    return int(buf[9:12]) if buf.startswith(b"HTTP/1.1 ") else None, buf.partition(b"\r\n\r\n")[2]


def post(path, body):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


def test_200_slow_header_clients_do_not_starve_others(model):
    s = Server("--read-timeout", "60")
    slow = []
    try:
        for i in range(200):
            c = socket.socket()
            c.bind((f"127.0.0.{2 + i}", 0))  # other clients, each from its own address
            c.connect(("127.0.0.1", s.port))
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(c)
        for _ in range(3):
            for c in slow:
                c.sendall(b"a")
            t0 = time.time()
            assert s.get("/health")[0] == 200
            assert time.time() - t0 < 2.0
            if FAKE:  # a model on a shared CPU may need longer than 2 s to generate, whatever the HTTP layer
                t0 = time.time()
                status, body = request(s.port, post(b"/v1/chat/completions", chat_body(model)))
                assert status == 200, body
                assert time.time() - t0 < 2.0
        # The slow clients were held, not dropped: the server did not buy its answers by closing them.
        for c in slow[::50]:
            c.setblocking(False)
            with pytest.raises(BlockingIOError):
                c.recv(1)
    finally:
        for c in slow:
            c.close()
        assert s.stop() == 0


def test_2gb_chunked_body_is_413_without_memory_growth():
    s = Server("--max-body-mb", "1")
    try:
        before = rss_kib(s.proc.pid)
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"100000\r\n" + b" " * 0x100000 + b"\r\n"  # 1 MiB chunks, 2 GiB in all unless answered
        reply = b""
        for _ in range(2048):
            readable, writable, _ = select.select([c], [c], [], 10)
            if readable:
                break
            try:
                c.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        while b"\r\n\r\n" not in reply:
            data = c.recv(65536)
            if not data:
                break
            reply += data
        c.close()
        assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
        growth_mib = (rss_kib(s.proc.pid, "VmHWM") - before) / 1024
        assert growth_mib < 100, f"peak RSS grew by {growth_mib:.0f} MiB"
        assert s.get("/health")[0] == 200
        if not SANITIZED:
            kept = kept_mib(s.proc.pid, before, 32)
            assert kept < 32, f"{kept:.0f} MiB kept after the request"
    finally:
        assert s.stop() == 0


def test_huge_prompt_is_refused_before_tokenizing(server, model):
    before = rss_kib(server.proc.pid)
    prompt = "word " * ((29 << 20) // 5)  # 29 MB
    for path, body in [(b"/v1/completions", json.dumps({"model": model, "prompt": prompt}).encode()),
                       (b"/v1/chat/completions", chat_body(model, prompt))]:
        status, reply = request(server.port, post(path, body), timeout=60)
        assert status == 400, reply[:300]
        assert json.loads(reply)["error"]["code"] == "context_length_exceeded"
    growth_mib = (rss_kib(server.proc.pid, "VmHWM") - before) / 1024
    # The body itself (29 MB) is held and parsed once; tokenizing it would cost over a gigabyte.
    assert growth_mib < 400, f"peak RSS grew by {growth_mib:.0f} MiB"
    # And the memory goes back once the requests are done.
    if not SANITIZED:
        kept = kept_mib(server.proc.pid, before, 24)
        assert kept < 24, f"{kept:.0f} MiB kept after the requests"


@pytest.mark.parametrize("fifo", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_fifo_in_place_of_a_model_file_is_refused(fifo):
    src = os.path.abspath("models/tiny-coder")
    with tempfile.TemporaryDirectory() as d:
        for name in os.listdir(src):
            if name == fifo:
                os.mkfifo(os.path.join(d, name))
            else:
                os.symlink(os.path.join(src, name), os.path.join(d, name))
        proc = subprocess.run([BIN, "serve", "--model", d, "--port", "0", "--backend", "cpu"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        # The tokenizer loader looks for a regular tokenizer.json and reports it missing.
        assert "not a regular file" in proc.stderr or "no tokenizer.json" in proc.stderr, proc.stderr
        assert fifo in proc.stderr


@pytest.mark.skipif(not FAKE, reason="needs the fake engine's load delay")
def test_a_signal_ends_serve_while_it_loads():
    proc = subprocess.Popen([BIN, "serve", "--fake-engine", "--port", "0", "--fake-load-delay-ms", "60000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("serve ignored SIGTERM while loading")
    assert code == 128 + signal.SIGTERM


def test_every_admitted_generation_is_accounted_for(server, model):
    """admitted = sum of finished generations by reason, once the server is idle: nothing orphaned."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)

    def run(i):
        try:
            if i % 2:
                stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                        max_tokens=32, stream=True)
                for n, _ in enumerate(stream):
                    if i % 3 == 0 and n == 2:
                        stream.close()
                        return
            else:
                c = socket.create_connection(("127.0.0.1", server.port))
                c.sendall(post(b"/v1/chat/completions", chat_body(model, max_tokens=32)))
                if i % 4 == 0:
                    time.sleep(0.05)
                    c.close()  # leaves before the answer
                    return
                c.recv(65536)
                c.close()
        except openai.APIError:
            pass

    threads = [threading.Thread(target=run, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    def settled():
        m = server.metrics()
        finished = sum(v for k, v in m.items() if k.startswith("puredrive_generations_total{"))
        return m["puredrive_queue_length"] == 0 and m["puredrive_requests_running"] == 0 and \
            m["puredrive_generations_admitted_total"] == finished

    deadline = time.time() + 60
    while time.time() < deadline and not settled():
        time.sleep(0.1)
    assert settled(), server.metrics()
