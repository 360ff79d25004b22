#!/usr/bin/env python3
"""Speed through the API: `puredrive serve` on a checkpoint, driven by the official OpenAI Python client.

For every MTP draft length given (--mtp-drafts, default "0,2": plain decoding and MTP k = 2) the script starts
`puredrive serve --model DIR --mtp-draft K`, records how long the server took to listen (and its own
"model ready" line: mapping and weight upload), sends one warm-up request, then for every context and run a
streaming chat completion (greedy, --tokens completion tokens) whose user message is the same code text that
`puredrive bench --model` prefills for that context and run (`bench --prompt-text`). Per request: TTFT (request
sent -> first streamed token), decode tok/s = (completion tokens - 1) / (last token - first token), prompt and
completion tokens from the stream's usage. The median and spread per (k, context) go beside `bench --model`'s
figures (bench/device/run.sh compares them).

Usage (in the venv of tests/server/setup.sh, which pins the openai client):
  api_bench.py --bin build/default/bin/puredrive --model DIR [--contexts 2k] [--tokens 512] [--runs 3]
               [--mtp-drafts 0,2] [--backend auto] [--json OUT] [--commit SHA]
Exit status 0 when every request completed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]


def parse_contexts(text: str) -> list[int]:
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        out.append(int(item[:-1]) * 1024 if item.endswith("k") else int(item))
    return out


class Server:
    """One `puredrive serve` process on a free port; its log goes to a file."""

    def __init__(self, args, mtp_draft: int, ctx_size: int, log_dir: str):
        self.log_path = os.path.join(log_dir, f"serve-mtp{mtp_draft}.log")
        self.log = open(self.log_path, "w")
        # Measured runs get no prefix-cache hits (docs/DESIGN.md §7): longer contexts start with the shorter ones' text.
        cmd = [args.bin, "serve", "--model", args.model, "--port", "0", "--backend", args.backend,
               "--mtp-draft", str(mtp_draft), "--ctx-size", str(ctx_size), "--model-alias", "bench",
               "--prefix-cache", "off"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = ""
        deadline = t0 + args.load_timeout
        while time.monotonic() < deadline and "listening on" not in line:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                if not line and self.proc.poll() is not None:
                    break
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"server did not start: {' '.join(cmd)}\n{self.log_text()[-4000:]}")
        self.listen_seconds = time.monotonic() - t0
        self.url = f"http://127.0.0.1:{m.group(1)}/v1"
        ready = re.search(r"model ready in ([\d.]+) s \(checkpoint mapped in ([\d.]+) s, weights bound in ([\d.]+) s\)",
                          self.log_text())
        self.ready = ({"model_ready_seconds": float(ready.group(1)), "map_seconds": float(ready.group(2)),
                       "upload_seconds": float(ready.group(3))} if ready else {})

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def prompt_text(args, run: int, context: int) -> str:
    r = subprocess.run([args.bin, "bench", "--model", args.model, "--prompt-text", str(run % 3), "--contexts",
                        str(context), "--prompt-root", args.prompt_root], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bench --prompt-text failed: {r.stderr}")
    return r.stdout


def stream_request(client: openai.OpenAI, text: str, max_tokens: int) -> dict:
    """One streaming chat completion; times taken at the client."""
    t0 = time.monotonic()
    first = last = None
    usage = None
    finish = None
    chunks = 0
    stream = client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            # Thinking templates stream reasoning_content before content; both are generated tokens.
            if d.content or getattr(d, "reasoning_content", None) or d.tool_calls:
                now = time.monotonic()
                first = first if first is not None else now
                last = now
                chunks += 1
            if choice.finish_reason:
                finish = choice.finish_reason
    if first is None or usage is None:
        raise RuntimeError("the stream carried no tokens or no usage")
    n = usage.completion_tokens
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": n, "chunks": chunks,
            "ttft_seconds": first - t0, "total_seconds": last - t0,
            "decode_tokens_per_second": (n - 1) / (last - first) if n > 1 and last > first else None,
            "finish_reason": finish}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="2k")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mtp-drafts", default="0,2")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--prompt-root", default=str(ROOT))
    ap.add_argument("--load-timeout", type=float, default=600)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--commit", default="")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    contexts = parse_contexts(args.contexts)
    drafts = [int(k) for k in args.mtp_drafts.split(",")]
    # Room for the chat template's tokens around the prompt, and the completion.
    ctx_size = max(contexts) + args.tokens + 512
    prompts = {(c, r): prompt_text(args, r, c) for c in contexts for r in range(min(args.runs, 3))}
    record = {"schema": "puredrive-api-bench/1", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": args.commit, "note": args.note, "model": args.model, "backend": args.backend,
              "openai_client": openai.__version__,
              "protocol": {"endpoint": "chat.completions, stream, include_usage", "temperature": 0,
                           "max_tokens": args.tokens, "runs": args.runs, "contexts": contexts,
                           "prompt": "bench --model's prompt for the context and run, as the user message",
                           "decode_tokens_per_second": "(completion tokens - 1) / (last token - first token)",
                           "ttft": "request sent -> first streamed token", "session_ctx_size": ctx_size},
              "servers": [], "cells": [], "summary": [], "complete": False}
    failures = 0
    with tempfile.TemporaryDirectory(prefix="pd-api-bench-") as log_dir:
        for k in drafts:
            server = Server(args, k, ctx_size, log_dir)
            try:
                client = openai.OpenAI(base_url=server.url, api_key="none", timeout=3600, max_retries=0)
                stream_request(client, "Say something.", 16)  # warm-up: first graph captures, first touches
                record["servers"].append({"mtp_draft": k, "listen_seconds": server.listen_seconds, **server.ready})
                print(f"serve --mtp-draft {k}: listening after {server.listen_seconds:.1f} s {server.ready}",
                      file=sys.stderr)
                for c in contexts:
                    for r in range(args.runs):
                        try:
                            cell = stream_request(client, prompts[(c, r % 3)], args.tokens)
                        except Exception as e:  # noqa: BLE001: recorded, the run goes on
                            failures += 1
                            cell = {"error": f"{type(e).__name__}: {e}"}
                        cell.update({"mtp_draft": k, "context": c, "run": r, "prompt": r % 3})
                        record["cells"].append(cell)
                        print(f"  k={k} context {c} run {r}: {json.dumps(cell)}", file=sys.stderr)
                        if args.json_out:
                            Path(args.json_out).write_text(json.dumps(record, indent=2) + "\n")
            finally:
                server.stop()
                record.setdefault("server_logs", {})[str(k)] = server.log_text()[-3000:]
    for k in drafts:
        for c in contexts:
            cells = [x for x in record["cells"] if x["mtp_draft"] == k and x["context"] == c and "error" not in x]
            tps = [x["decode_tokens_per_second"] for x in cells if x.get("decode_tokens_per_second")]
            if not tps:
                continue
            record["summary"].append({
                "mtp_draft": k, "context": c, "runs": len(tps),
                "decode_tokens_per_second_median": statistics.median(tps), "decode_tokens_per_second_min": min(tps),
                "decode_tokens_per_second_max": max(tps),
                "ttft_seconds_median": statistics.median(x["ttft_seconds"] for x in cells),
                "prompt_tokens_median": statistics.median(x["prompt_tokens"] for x in cells)})
    record["complete"] = failures == 0
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'k':>3} {'context':>8} {'runs':>4} {'decode t/s':>11} {'(min..max)':>17} {'TTFT s':>8} {'prompt':>7}")
    for s in record["summary"]:
        print(f"{s['mtp_draft']:>3} {s['context']:>8} {s['runs']:>4} {s['decode_tokens_per_second_median']:>11.1f} "
              f"{'(%.1f..%.1f)' % (s['decode_tokens_per_second_min'], s['decode_tokens_per_second_max']):>17} "
              f"{s['ttft_seconds_median']:>8.3f} {s['prompt_tokens_median']:>7.0f}")
    for srv in record["servers"]:
        print(f"serve --mtp-draft {srv['mtp_draft']}: listening after {srv['listen_seconds']:.1f} s, "
              f"model ready {srv.get('model_ready_seconds', '?')} s (upload {srv.get('upload_seconds', '?')} s)")
    if failures:
        print(f"{failures} request(s) failed", file=sys.stderr)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
