#!/usr/bin/env python3
"""Replays a 10-turn coding-agent conversation with tool calls against `puredrive serve`, with the prefix cache on
and off: the prefix cache's bench (docs/DESIGN.md §4.8) and, with fewer turns, its server test.

The transcript is written by this script, deterministically: a system prompt, four tools, one user task, then
per turn a scripted assistant tool call and its result (a code search, source files read, test runs, an edit),
synthetic Python text from a seeded generator. It grows past 16K tokens over 10 turns for the bundled tiny coder
(--scale multiplies the tool results). Every request resends the whole conversation, as agents do, and is
streamed (greedy by default) with usage.

Checks (exit status 1 when one fails, with --check):
  - every turn after the first prefills only its new tokens: prompt - cached tokens <= (prompt tokens - the
    previous turn's prompt tokens) + 64 (the block the previous prompt ended in is prefilled again);
  - the output of every turn (reasoning, content, tool calls, finish reason) is identical with the cache on and
    off; the cache-off server reports 0 cached tokens;
  - optionally (--max-ttft-ratio R) turn N's TTFT with the cache <= R * its TTFT cold (the cache-off server, or
    without one the same prompt under a fresh session id so that nothing of it is cached).
TTFT: request sent -> first streamed token (reasoning, content or tool call).

Standard library only. Usage:
  agent_replay.py --bin build/default/bin/puredrive --model models/tiny-coder [--serve-args "--backend cpu"]
                  [--out bench/results/FILE.md]
      starts `serve` with the cache on, then with --prefix-cache off, one after the other;
  agent_replay.py --url http://HOST:PORT [--url-off http://HOST:PORT] [--model-name NAME]
      against servers started elsewhere (e.g. a 35B checkpoint on a GPU: `puredrive serve --model DIR` and
      `puredrive serve --model DIR --prefix-cache off --port ...`).
Options: --turns N (default 10), --scale F (default 1.0), --max-tokens N (default 32), --seed S (seeded sampling
at --temperature, default greedy), --ctx-size N (with --bin, default 32768), --session ID (default random; the
same for the on and off runs).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import select
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from datetime import datetime, timezone
from pathlib import Path

BLOCK = 64  # the prefix cache's block (tokens); a hit resumes on a multiple of it

WORDS = ("path config buffer token cache index parser record stream window batch queue frame header value "
         "entry matrix vector result status handle reader writer source target offset length count limit "
         "scale block chunk state layer model request reply session client server engine option format "
         "report table column row shape width height weight bias score rank node edge graph tree leaf root "
         "child parent key name label group field item list map set pair line text word char byte file dir").split()
ERRORS = ["ValueError", "KeyError", "IndexError", "TypeError", "RuntimeError"]


# ---- The transcript ----

def ident(rng: random.Random, parts: int = 2) -> str:
    return "_".join(rng.choice(WORDS) for _ in range(parts))


def function_text(rng: random.Random, indent: str = "", method: bool = False) -> str:
    name = ident(rng, rng.randint(2, 3))
    args = list(dict.fromkeys(ident(rng, 1) for _ in range(rng.randint(1, 4))))
    lines = [f"{indent}def {name}({', '.join((['self'] if method else []) + args)}):",
             f'{indent}    """Return the {ident(rng, 1)} of {args[0]} after {ident(rng, 2).replace("_", " ")}."""']
    var = ident(rng, 1) + "_" + str(rng.randint(0, 9))
    lines.append(f"{indent}    {var} = {args[0]}")
    for _ in range(rng.randint(2, 7)):
        kind = rng.random()
        a = rng.choice(args)
        if kind < 0.3:
            lines.append(f"{indent}    if {a} is None:")
            lines.append(f"{indent}        raise {rng.choice(ERRORS)}(\"{ident(rng, 1)} {a} must be set\")")
        elif kind < 0.55:
            lines.append(f"{indent}    for {ident(rng, 1)}_item in {a}:")
            lines.append(f"{indent}        {var} = {var} + {rng.randint(1, 64)}")
        elif kind < 0.8:
            lines.append(f"{indent}    {ident(rng, 1)} = {a}.{ident(rng, 2)}({var}, {rng.randint(0, 255)})")
        else:
            lines.append(f"{indent}    # {ident(rng, 3).replace('_', ' ')} before the {ident(rng, 1)}")
    lines.append(f"{indent}    return {var}")
    return "\n".join(lines) + "\n"


def module_text(rng: random.Random, name: str, chars: int) -> str:
    """Python-looking source of about `chars` characters."""
    parts = [f'"""{name}: {ident(rng, 3).replace("_", " ")} helpers."""\n',
             "import os\nimport re\nfrom dataclasses import dataclass\n"]
    size = sum(map(len, parts))
    while size < chars:
        if rng.random() < 0.25:
            cls = "".join(w.capitalize() for w in ident(rng, 2).split("_"))
            body = [f"\n@dataclass\nclass {cls}:\n",
                    f"    {ident(rng, 1)}: int = {rng.randint(0, 100)}\n",
                    f"    {ident(rng, 1)}: str = \"{ident(rng, 1)}\"\n\n"]
            body += [function_text(rng, "    ", method=True) + "\n" for _ in range(rng.randint(1, 3))]
            text = "".join(body)
        else:
            text = "\n" + function_text(rng)
        parts.append(text)
        size += len(text)
    return "".join(parts)


TOOLS = [
    {"type": "function", "function": {
        "name": "search_code", "description": "Search the repository for a regular expression.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}},
                       "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "edit_file", "description": "Replace a unique piece of text in a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                        "new": {"type": "string"}},
                       "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite, or the tests matching a pattern.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}}}},
]


def transcript(turns: int, scale: float, session: str) -> list[list[dict]]:
    """The messages of every request: request k is the conversation up to turn k."""
    rng = random.Random(20261201)
    files = [f"src/{ident(rng, 1)}/{ident(rng, 2)}.py" for _ in range(4)]
    system = (f"Session {session}.\nYou are a coding agent working in a Python repository. Use the tools to "
              "inspect and change the code; make the smallest change that fixes the task, run the tests, and "
              "explain what you did.\n\nRules:\n" +
              "\n".join(f"- {ident(rng, 4).replace('_', ' ')}." for _ in range(24)))
    task = (f"The function {ident(rng, 2)} in {files[0]} raises KeyError when the {ident(rng, 1)} is empty. "
            "Find the cause and fix it; keep the public API unchanged.")
    big = lambda n: int(n * scale)  # noqa: E731
    # (tool, arguments, result) of turns 2, 3, ...: searches and reads first, then edits and short test runs.
    steps = [
        ("search_code", {"pattern": ident(rng, 2)},
         "\n".join(f"{rng.choice(files)}:{rng.randint(1, 900)}: {function_text(rng).splitlines()[rng.randint(0, 2)]}"
                   for _ in range(max(4, big(3000) // 70)))),
        ("read_file", {"path": files[0]}, module_text(rng, files[0], big(16000))),
        ("read_file", {"path": files[1]}, module_text(rng, files[1], big(16000))),
        ("read_file", {"path": files[2]}, module_text(rng, files[2], big(14000))),
        ("read_file", {"path": files[3]}, module_text(rng, files[3], big(10000))),
        ("run_tests", {"pattern": ident(rng, 1)},
         "".join(f"FAILED tests/test_{ident(rng, 1)}.py::test_{ident(rng, 2)} - {rng.choice(ERRORS)}: "
                 f"'{ident(rng, 1)}'\n" for _ in range(max(2, big(4000) // 90)))),
        ("edit_file", {"path": files[0], "old": function_text(rng), "new": function_text(rng)},
         f"Edited {files[0]}: 1 replacement."),
        ("run_tests", {"pattern": ident(rng, 1)}, "collected 212 items\n\n212 passed in 3.41s\n"),
        ("read_file", {"path": files[0]}, module_text(rng, files[0], 1200)),
    ]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    requests = [list(messages)]
    for k in range(turns - 1):
        tool, args, result = steps[k % len(steps)]
        call_id = f"call_{k + 1}"
        messages.append({"role": "assistant", "content": f"Step {k + 1}: {tool}.",
                         "tool_calls": [{"id": call_id, "type": "function",
                                         "function": {"name": tool, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        requests.append(list(messages))
    return requests


# ---- HTTP ----

def stream_chat(url: str, model: str, messages: list[dict], args) -> dict:
    """One streamed chat completion: TTFT, the whole output, usage."""
    u = urllib.parse.urlparse(url)
    body = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": args.max_tokens,
            "temperature": args.temperature if args.seed is not None else 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.seed is not None:
        body["seed"] = args.seed
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=args.timeout)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read().decode(errors='replace')[:500]}")
    first = None
    out = {"reasoning": "", "content": "", "tool_calls": [], "finish_reason": None, "usage": None}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for choice in chunk.get("choices", []):
            d = choice.get("delta", {})
            if d.get("content") or d.get("reasoning_content") or d.get("tool_calls"):
                first = first if first is not None else time.monotonic()
            out["reasoning"] += d.get("reasoning_content") or ""
            out["content"] += d.get("content") or ""
            out["tool_calls"] += d.get("tool_calls") or []
            out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
    end = time.monotonic()
    conn.close()
    if out["usage"] is None:
        raise RuntimeError("the stream carried no usage")
    out["ttft"] = (first if first is not None else end) - t0
    out["total"] = end - t0
    return out


class Server:
    """`puredrive serve` on a free port; its log goes to a file."""

    def __init__(self, args, extra: list[str], log_dir: str, name: str):
        self.log_path = os.path.join(log_dir, f"serve-{name}.log")
        self.log = open(self.log_path, "w")
        cmd = [args.bin, "serve", "--model", args.model, "--port", "0", "--ctx-size", str(args.ctx_size),
               "--model-alias", args.model_name, *args.serve_args.split(), *extra]
        self.cmd = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line, deadline = "", time.monotonic() + args.load_timeout
        while time.monotonic() < deadline and "listening on" not in line:
            if select.select([self.proc.stdout], [], [], 1.0)[0]:
                line = self.proc.stdout.readline()
                if not line and self.proc.poll() is not None:
                    break
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"server did not start: {self.cmd}\n{open(self.log_path).read()[-3000:]}")
        self.url = f"http://127.0.0.1:{m.group(1)}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---- The replay ----

def replay(url: str, requests: list[list[dict]], args, label: str) -> list[dict]:
    # Warm-up: a short unrelated request (first-use costs are not the cache's business).
    stream_chat(url, args.model_name, [{"role": "user", "content": f"warm-up {uuid.uuid4().hex}"}], args)
    results = []
    for k, messages in enumerate(requests, 1):
        r = stream_chat(url, args.model_name, messages, args)
        u = r["usage"]
        r["prompt_tokens"] = u["prompt_tokens"]
        r["cached_tokens"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        print(f"[{label}] turn {k}: prompt {r['prompt_tokens']}, cached {r['cached_tokens']}, "
              f"TTFT {r['ttft']:.3f} s, total {r['total']:.3f} s", flush=True)
        results.append(r)
    return results


def output_of(r: dict) -> tuple:
    return (r["reasoning"], r["content"], json.dumps(r["tool_calls"], sort_keys=True), r["finish_reason"])


def check(on: list[dict], off: list[dict] | None, cold: dict | None, args) -> list[str]:
    problems = []
    for k in range(1, len(on)):
        new = on[k]["prompt_tokens"] - on[k - 1]["prompt_tokens"]
        prefilled = on[k]["prompt_tokens"] - on[k]["cached_tokens"]
        if prefilled > new + BLOCK:
            problems.append(f"turn {k + 1}: prefilled {prefilled} tokens, {new} are new")
    if off is not None:
        for k, (a, b) in enumerate(zip(on, off), 1):
            if output_of(a) != output_of(b):
                problems.append(f"turn {k}: the output differs with the cache off")
            if b["cached_tokens"] != 0:
                problems.append(f"turn {k}: the cache-off server reports {b['cached_tokens']} cached tokens")
    if args.max_ttft_ratio is not None:
        ref = off[-1]["ttft"] if off is not None else cold["ttft"]
        if on[-1]["ttft"] > args.max_ttft_ratio * ref:
            problems.append(f"turn {len(on)}: TTFT {on[-1]['ttft']:.3f} s > {args.max_ttft_ratio} x {ref:.3f} s cold")
    return problems


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
        return sha + (" (dirty tree)" if dirty.strip() else " (clean tree)")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_record(path: str, on, off, cold, problems, args, command: str, serve_cmds: list[str], commit: str) -> None:
    lines = [f"# Prefix cache: {len(on)}-turn agent replay ({datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC})", "",
             f"Command: `{command}`", "",
             f"Commit: {commit}. Servers: " + "; ".join(f"`{c}`" for c in serve_cmds) + ".", "",
             f"Transcript: bench/agent_replay.py, {len(on)} turns (scale {args.scale}), session `{args.session}`, "
             f"{args.max_tokens} completion tokens per turn, " +
             (f"seeded sampling (seed {args.seed}, T {args.temperature})." if args.seed is not None else "greedy."),
             "", "| turn | prompt tokens | new | cached | prefilled | TTFT cache on (s) | TTFT cache off (s) | "
             "on / off | same output |", "|---|---|---|---|---|---|---|---|---|"]
    for k, r in enumerate(on):
        new = r["prompt_tokens"] - (on[k - 1]["prompt_tokens"] if k else 0)
        o = off[k] if off is not None else None
        lines.append(f"| {k + 1} | {r['prompt_tokens']} | {new} | {r['cached_tokens']} | "
                     f"{r['prompt_tokens'] - r['cached_tokens']} | {r['ttft']:.3f} | "
                     + (f"{o['ttft']:.3f} | {r['ttft'] / o['ttft']:.1%} | {'yes' if output_of(r) == output_of(o) else 'NO'} |"
                        if o else "- | - | - |"))
    ref = off[-1]["ttft"] if off is not None else cold["ttft"]
    lines += ["", f"Turn {len(on)}: TTFT {on[-1]['ttft']:.3f} s with the cache against {ref:.3f} s cold: "
                  f"{on[-1]['ttft'] / ref:.1%}.", "",
              "Checks: " + ("all passed." if not problems else "FAILED: " + "; ".join(problems)), ""]
    Path(path).write_text("\n".join(lines))
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin")
    ap.add_argument("--model")
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--ctx-size", type=int, default=32768)
    ap.add_argument("--url")
    ap.add_argument("--url-off")
    ap.add_argument("--model-name", default="replay")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--session", default=uuid.uuid4().hex[:12])
    ap.add_argument("--max-ttft-ratio", type=float)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--load-timeout", type=float, default=600)
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if bool(args.url) == bool(args.bin and args.model):
        ap.error("give either --bin and --model, or --url")
    requests = transcript(args.turns, args.scale, args.session)
    command = shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    commit = git_commit()  # of the tree the run starts from
    serve_cmds, off, cold = [], None, None
    if args.url:
        serve_cmds.append(args.url)
        on = replay(args.url, requests, args, "on")
        if args.url_off:
            serve_cmds.append(args.url_off)
            off = replay(args.url_off, requests, args, "off")
        else:
            cold_session = transcript(args.turns, args.scale, uuid.uuid4().hex[:12])[-1]
            cold = stream_chat(args.url, args.model_name, cold_session, args)
            print(f"[cold] turn {args.turns} under a new session: TTFT {cold['ttft']:.3f} s", flush=True)
    else:
        with tempfile.TemporaryDirectory(prefix="agent-replay-") as logs:
            for name, extra in (("on", []), ("off", ["--prefix-cache", "off"])):
                s = Server(args, extra, logs, name)
                serve_cmds.append(s.cmd)
                try:
                    result = replay(s.url, requests, args, name)
                finally:
                    s.stop()
                if name == "on":
                    on = result
                else:
                    off = result
    problems = check(on, off, cold, args)
    for p in problems:
        print("CHECK FAILED:", p, file=sys.stderr)
    if args.out:
        write_record(args.out, on, off, cold, problems, args, command, serve_cmds, commit)
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
