#!/usr/bin/env python3
"""Soak test of `puredrive serve` (issue 19; not run in CI): many concurrent clients for a while, with random
disconnects, cancellations and timeout-and-retry, against the bundled tiny coder, greedy.

Checks, and records in bench/results/ (--out):
  - lost: a request that ran to completion on the client side without a complete response;
  - mixed: a completed response (streamed or not) that differs from the same request run alone;
  - orphaned: generations still queued or running once every client has stopped, or admitted generations
    that never finished (puredrive_generations_admitted_total against puredrive_generations_total);
  - 5xx answers; RSS drift after warm-up (median of the last fifth against the fifth after warm-up).

Standard library only. Usage:
  bench/soak.py [--bin build/default/bin/puredrive] [--clients 64] [--minutes 10] [--out FILE.md]
"""

import argparse
import http.client
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def __init__(self):\n",
    "import os\n\ndef list_files(path):\n",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "def merge_sort(items):\n",
    "with open('data.txt') as f:\n",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n",
    "async def fetch(session, url):\n",
]
MAX_TOKENS = [8, 24, 48]
BEHAVIOURS = [("plain", 30), ("stream", 30), ("stream_hangup", 12), ("hangup", 12), ("retry", 16)]


class Server:
    def __init__(self, binary, extra):
        cmd = [binary, "serve", "--model", "models/tiny-coder", "--port", "0", *extra]
        self.log = open("/tmp/puredrive-soak-server.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.proc.kill()
            sys.exit(f"server did not start: {' '.join(cmd)}")
        self.port = int(m.group(1))

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def body(kind, prompt, max_tokens, stream):
    b = {"model": "tiny-coder", "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if kind == "chat":
        b["messages"] = [{"role": "user", "content": "Complete this code:\n" + prompt}]
        b["chat_template_kwargs"] = {"enable_thinking": False}
    else:
        b["prompt"] = prompt
    return json.dumps(b)


def path(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def message_text(kind, choice):
    """The generated text of a whole response: reasoning and content (chat), or the text (completions)."""
    if kind == "completion":
        return choice.get("text") or ""
    m = choice.get("message") or {}
    return (m.get("reasoning_content") or "") + "\x00" + (m.get("content") or "")


def delta_parts(kind, choice):
    """(reasoning, content) of one streamed chunk's choice."""
    if kind == "completion":
        return "", choice.get("text") or ""
    d = choice.get("delta") or {}
    return d.get("reasoning_content") or "", d.get("content") or ""


def request_plain(port, kind, prompt, max_tokens, timeout):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path(kind), body(kind, prompt, max_tokens, False), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            return r.status, None
        choice = json.loads(data)["choices"][0]
        return 200, message_text(kind, choice)
    finally:
        c.close()


def request_stream(port, kind, prompt, max_tokens, hang_up_after=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        c.request("POST", path(kind), body(kind, prompt, max_tokens, True), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return r.status, None
        reasoning, content, chunks, done = "", "", 0, False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return 500, None
            if chunk.get("choices"):
                r_part, c_part = delta_parts(kind, chunk["choices"][0])
                reasoning += r_part
                content += c_part
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                return "left", None
        if not done:
            return "truncated", None
        return 200, content if kind == "completion" else reasoning + "\x00" + content
    finally:
        c.close()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.problems = []

    def add(self, key, problem=None):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if problem:
                self.problems.append(problem)


def client(port, refs, deadline, seed, tally):
    rng = random.Random(seed)
    names = [b for b, _ in BEHAVIOURS]
    weights = [w for _, w in BEHAVIOURS]
    while time.time() < deadline:
        kind = rng.choice(["completion", "completion", "chat"])
        prompt = rng.choice(PROMPTS)
        n = rng.choice(MAX_TOKENS)
        behaviour = rng.choices(names, weights)[0]
        expected = refs[(kind, prompt, n)]
        try:
            if behaviour == "plain":
                status, text = request_plain(port, kind, prompt, n, 600)
            elif behaviour == "stream":
                status, text = request_stream(port, kind, prompt, n)
            elif behaviour == "stream_hangup":
                status, text = request_stream(port, kind, prompt, n, hang_up_after=rng.randint(1, 4))
            elif behaviour == "hangup":
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                c.request("POST", path(kind), body(kind, prompt, n, False), {"Content-Type": "application/json"})
                time.sleep(rng.uniform(0, 0.3))
                c.sock.shutdown(socket.SHUT_RDWR)
                c.close()
                status, text = "left", None
            else:  # retry: a client-side timeout, then the same request again with patience
                try:
                    status, text = request_plain(port, kind, prompt, n, rng.uniform(0.05, 0.5))
                except (socket.timeout, TimeoutError):
                    tally.add("timed_out_then_retried")
                    status, text = request_plain(port, kind, prompt, n, 600)
        except (ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException) as e:
            tally.add("lost", f"{behaviour} {kind}: {e!r}")
            continue
        if status == 200:
            if text == expected:
                tally.add("ok_" + behaviour)
            else:
                tally.add("mixed", f"{behaviour} {kind} n={n}: {text!r} != {expected!r}")
        elif status == "left":
            tally.add("left_" + behaviour)
        elif status == 503:
            tally.add("503")
            time.sleep(rng.uniform(0.5, 2.0))
        else:
            tally.add(f"status_{status}", f"{behaviour} {kind}: status {status}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/default/bin/puredrive")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--out", help="markdown record to write")
    ap.add_argument("--serve-args", default="--backend cpu --max-queue 64 --http-threads 96 --ctx-size 1024",
                    help="extra arguments of puredrive serve")
    a = ap.parse_args()

    server = Server(a.bin, a.serve_args.split())
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"server on port {server.port}; references (each request alone) ...", flush=True)
    refs = {}
    for kind in ["completion", "chat"]:
        for p in PROMPTS:
            for n in MAX_TOKENS:
                status, text = request_plain(server.port, kind, p, n, 600)
                assert status == 200, status
                refs[(kind, p, n)] = text
    # The streamed form of each must be the same text.
    for (kind, p, n), text in list(refs.items())[::7]:
        assert request_stream(server.port, kind, p, n) == (200, text), (kind, p, n)

    tally = Tally()
    duration = a.minutes * 60
    t0 = time.time()
    deadline = t0 + duration
    threads = [threading.Thread(target=client, args=(server.port, refs, deadline, i, tally), daemon=True)
               for i in range(a.clients)]
    for t in threads:
        t.start()
    rss = []
    while time.time() < deadline:
        rss.append((time.time() - t0, server.rss_kib()))
        print(f"  t={rss[-1][0]:6.0f}s rss={rss[-1][1] / 1024:7.1f} MiB  {dict(sorted(tally.counts.items()))}",
              flush=True)
        time.sleep(min(10, max(0.1, deadline - time.time())))
    for t in threads:
        t.join(700)
    stuck = sum(t.is_alive() for t in threads)

    # Every client is gone: nothing may stay queued or running, and every admitted generation finished.
    settle_deadline = time.time() + 30
    while True:
        m = server.metrics()
        finished = sum(v for k, v in m.items() if k.startswith("puredrive_generations_total{"))
        idle = m["puredrive_queue_length"] == 0 and m["puredrive_requests_running"] == 0
        if (idle and finished == m["puredrive_generations_admitted_total"]) or time.time() > settle_deadline:
            break
        time.sleep(0.2)
    orphaned = int(m["puredrive_generations_admitted_total"] - finished) + int(m["puredrive_queue_length"]) + \
        int(m["puredrive_requests_running"])
    server_errors = sum(v for k, v in m.items() if k.startswith("puredrive_http_requests_total") and
                        re.search(r'status="5\d\d"', k) and 'status="503"' not in k)
    code = server.stop()

    warm = [kib for t, kib in rss if t >= duration * 0.2]
    fifth = max(1, len(warm) // 5)
    early, late = statistics.median(warm[:fifth]), statistics.median(warm[-fifth:])
    drift = (late - early) / early * 100 if early else 0.0
    c = tally.counts
    completed = sum(v for k, v in c.items() if k.startswith("ok_"))
    lost, mixed = c.get("lost", 0), c.get("mixed", 0)
    verdict_ok = lost == 0 and mixed == 0 and orphaned == 0 and server_errors == 0 and stuck == 0 and \
        abs(drift) < 5 and code == 0 and not any(k.startswith("status_") for k in c)
    generations = {k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("puredrive_generations_total{")}
    summary = {
        "started": started, "clients": a.clients, "minutes": a.minutes, "serve_args": a.serve_args,
        "outcomes": dict(sorted(c.items())), "completed_and_identical": completed, "lost": lost, "mixed": mixed,
        "orphaned": orphaned, "server_5xx_other_than_503": int(server_errors), "stuck_clients": stuck,
        "rss_mib_after_warmup": round(early / 1024, 1), "rss_mib_at_end": round(late / 1024, 1),
        "rss_drift_percent": round(drift, 2), "generations_admitted": int(m["puredrive_generations_admitted_total"]),
        "generations_by_reason": generations, "server_exit_code": code, "pass": verdict_ok,
    }
    print(json.dumps(summary, indent=2))
    for p in tally.problems[:20]:
        print("problem:", p)
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"# Soak of `puredrive serve` with the tiny coder ({started})\n\n")
            f.write(f"Command: `bench/soak.py --clients {a.clients} --minutes {a.minutes}` "
                    f"(serve {a.serve_args}); machine: the 2-core development machine, shared with other jobs.\n\n")
            f.write("```json\n" + json.dumps(summary, indent=2) + "\n```\n\n")
            f.write("RSS (MiB) over time:\n\n```\n")
            f.write("\n".join(f"{t:7.0f}s {kib / 1024:8.1f}" for t, kib in rss) + "\n```\n")
            if tally.problems:
                f.write("\nProblems:\n\n" + "\n".join(f"- {p}" for p in tally.problems[:50]) + "\n")
    sys.exit(0 if verdict_ok else 1)


if __name__ == "__main__":
    main()
