"""Fixtures of the server suite: a real `puredrive serve` process on a free port, an OpenAI client and an
Anthropic client.

PD_BIN is the binary to serve with (run_tests.sh sets it): puredrive_fake_serve for the fake engine,
puredrive for a model. PD_SERVE_ARGS chooses what is served: by default the
test-only fake engine (`--fake-engine`); later the same suite runs against the tiny coder model with
PD_SERVE_ARGS="--model models/tiny-coder". Tests that rely on the fake engine's scripted replies are marked
`fake_only` and skip against a real model.
"""

import atexit
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import anthropic
import openai
import pytest

SERVE_ARGS = shlex.split(os.environ.get("PD_SERVE_ARGS", "--fake-engine"))
FAKE = "--fake-engine" in SERVE_ARGS
# The fake engine is test code: only the test binary puredrive_fake_serve has it.
BIN = os.environ.get("PD_BIN", "build/default/bin/" + ("puredrive_fake_serve" if FAKE else "puredrive"))
CTX_SIZE = 2048

fake_only = pytest.mark.skipif(not FAKE, reason="relies on the fake engine's scripted replies")

LOG_DIR = tempfile.mkdtemp(prefix="pd-serve-logs-")
atexit.register(shutil.rmtree, LOG_DIR, True)


class Server:
    """One `puredrive serve` process. Its log goes to a file that is printed when a test fails."""

    def __init__(self, *extra):
        self.log = tempfile.NamedTemporaryFile(prefix="serve-", suffix=".log", dir=LOG_DIR, delete=False)
        defaults = {"--ctx-size": str(CTX_SIZE), "--read-timeout": "2", "--keepalive-ms": "300"}
        cmd = [BIN, "serve", "--port", "0"]
        for flag, value in defaults.items():
            if flag not in extra:  # a test's own value wins (each option may be given once)
                cmd += [flag, value]
        cmd += [*SERVE_ARGS, *extra]
        if FAKE and "--fake-token-delay-ms" not in extra:
            cmd += ["--fake-token-delay-ms", "1"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = ""
        deadline = time.time() + 60
        while time.time() < deadline and "listening on" not in line:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                if not line and self.proc.poll() is not None:
                    break
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {' '.join(cmd)}\n{self.log_text()}")
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def log_text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, timeout=15):
        """SIGTERM, like a user's Ctrl-C; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def get(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self):
        """Prometheus samples as {'name{labels}': value}."""
        status, text = self.get("/metrics")
        assert status == 200
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    code = s.stop()
    assert code == 0, f"server exit code {code}\n{s.log_text()[-4000:]}"


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def claude(server):
    """The official anthropic client against the same server (its base URL has no /v1)."""
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    srv = item.funcargs.get("server") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(srv, Server):
        report.sections.append(("puredrive serve log (tail)", srv.log_text()[-6000:]))
