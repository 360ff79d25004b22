#!/usr/bin/env python3
"""Encode speed of Python `tokenizers` on the reference corpus, single thread (bench/tokenizer.md).

Usage: RAYON_NUM_THREADS=1 python bench_tokenizer.py MODEL_DIR (CORPUS.jsonl | TEXT_FILE) [PASSES]
A .jsonl file gives the "text" of each line (the reference corpus); any other file is one string per line.
Same protocol as tests/tokenizer/tokenizer_bench.cpp (CPU time of the process, as the build machines
are shared and wall time would measure the neighbours too): every corpus string encoded separately with
Tokenizer.encode (one call per string, so no batch parallelism); the first pass and the best later pass;
then the whole corpus in one encode_batch call, which removes the per-call Python overhead.
"""
import json
import os
import sys
import time

import tokenizers
from tokenizers import Tokenizer


def main():
    model_dir, corpus_path = sys.argv[1], sys.argv[2]
    passes = max(2, int(sys.argv[3])) if len(sys.argv) > 3 else 5
    with open(corpus_path, encoding="utf-8") as f:
        if corpus_path.endswith(".jsonl"):
            texts = [json.loads(line)["text"] for line in f if line.strip()]
        else:  # plain text: one string per line, newline included (split on "\n" only, like the C++ side)
            lines = f.read().split("\n")
            texts = [x for x in [line + "\n" for line in lines[:-1]] + lines[-1:] if x]
    nbytes = sum(len(t.encode()) for t in texts)
    best_load = min(_timed(lambda: Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")))
                    for _ in range(3))
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    times = []
    n_ids = 0
    for _ in range(passes):
        t0 = time.process_time()
        n_ids = sum(len(tok.encode(t).ids) for t in texts)
        times.append(time.process_time() - t0)
    mb = nbytes / 1e6
    print(f"tokenizers {tokenizers.__version__}: strings {len(texts)}, {mb:.3f} MB, {n_ids} tokens")
    print(f"load (best of 3): {best_load:.3f} CPU s")
    print(f"encode, first pass (cold cache): {times[0]:.3f} CPU s, {mb / times[0]:.2f} MB/s")
    best = min(times[1:])
    print(f"encode, best later pass (warm cache): {best:.3f} CPU s, {mb / best:.2f} MB/s")
    # One encode_batch call: no per-string Python overhead (rayon work, one thread with RAYON_NUM_THREADS=1).
    batch = []
    for _ in range(passes):
        t0 = time.process_time()
        tok.encode_batch(texts)
        batch.append(time.process_time() - t0)
    print(f"encode_batch, best pass: {min(batch):.3f} CPU s, {mb / min(batch):.2f} MB/s")


def _timed(fn):
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


if __name__ == "__main__":
    main()
