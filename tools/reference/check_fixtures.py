#!/usr/bin/env python3
"""Checks that tests/fixtures/<name>/ follow tests/fixtures/FORMAT.md (keys, dtypes, shapes, internal consistency).

Needs only numpy + safetensors. Usage: check_fixtures.py [FIXTURES_DIR]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def check(fdir: str) -> list[str]:
    errors: list[str] = []

    def expect(cond: bool, msg: str) -> None:
        if not cond:
            errors.append(f"{os.path.basename(fdir)}: {msg}")

    with open(os.path.join(fdir, "reference.json")) as f:
        meta = json.load(f)
    with open(os.path.join(fdir, "config.json")) as f:
        tc = text_config(json.load(f))
    required = ("name", "model_type", "weights_dtype", "tolerance", "prompts", "greedy_tokens", "mtp_chain", "generator")
    for key in required:
        expect(key in meta, f"reference.json lacks {key!r}")
    expect(meta["weights_dtype"] in ("float32", "bfloat16", "mlx-affine"), "weights_dtype")
    for key in ("torch", "transformers", "seed"):
        expect(key in meta["generator"], f"generator lacks {key!r}")
    expect(
        os.path.exists(os.path.join(fdir, "model.safetensors"))
        or os.path.exists(os.path.join(fdir, "model.safetensors.index.json")),
        "no checkpoint",
    )
    expect(os.path.exists(os.path.join(fdir, "generation_config.json")), "no generation_config.json")
    # Fixtures of a committed model (symlinked checkpoint) record its hashes: a retrained model needs a new fixture.
    for fname, want in meta.get("checkpoint_sha256", {}).items():
        with open(os.path.join(fdir, fname), "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        expect(got == want, f"{fname} changed since the reference was made (regenerate: make fixtures)")

    ref = load_file(os.path.join(fdir, "reference.safetensors"))
    H, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    G, K = meta["greedy_tokens"], meta["mtp_chain"]
    expected_keys = set()
    for p in meta["prompts"]:
        ids = ref[f"{p}.input_ids"]
        T = ids.shape[0]
        N = T  # stored rows of the row-indexed tensors
        if f"{p}.rows" in ref:
            rows = ref[f"{p}.rows"]
            expected_keys.add(f"{p}.rows")
            expect(rows.dtype == np.int32 and rows.ndim == 1, f"{p}.rows must be I32 [n]")
            expect(bool((np.diff(rows) > 0).all()), f"{p}.rows not strictly increasing")
            expect(rows.size > 0 and rows[0] >= 0 and rows[-1] == T - 1, f"{p}.rows must lie in [0, T) and end at T-1")
            N = rows.shape[0]
        shapes = {
            f"{p}.input_ids": ((T,), np.int32),
            f"{p}.final_hidden": ((N, H), np.float32),
            f"{p}.logits": ((N, V), np.float32),
            f"{p}.greedy": ((G,), np.int32),
            f"{p}.mtp.logits": ((N, V), np.float32),
            f"{p}.mtp.hidden": ((N, H), np.float32),
            f"{p}.mtp.chain_tokens": ((K,), np.int32),
            f"{p}.mtp.chain_logits": ((K, V), np.float32),
        }
        shapes.update({f"{p}.hidden.{layer}": ((N, H), np.float32) for layer in range(L)})
        for key, (shape, dtype) in shapes.items():
            expected_keys.add(key)
            if key not in ref:
                expect(False, f"missing {key}")
                continue
            expect(ref[key].shape == shape, f"{key} shape {ref[key].shape} != {shape}")
            expect(ref[key].dtype == dtype, f"{key} dtype {ref[key].dtype} != {dtype}")
        if errors:
            continue
        expect(((ids >= 0) & (ids < V)).all(), f"{p}: ids out of range")
        expect(np.array_equal(ref[f"{p}.logits"][-1].argmax(), ref[f"{p}.greedy"][0]), f"{p}: greedy[0] != argmax")
        chain = ref[f"{p}.mtp.chain_tokens"]
        expect(np.array_equal(ref[f"{p}.mtp.chain_logits"].argmax(-1), chain), f"{p}: chain tokens != argmax")
        expect(np.array_equal(ref[f"{p}.mtp.chain_logits"][0], ref[f"{p}.mtp.logits"][-1]), f"{p}: chain step 1")
        # final_hidden = zero-centred RMSNorm of the last layer's output (up to the unknown norm weight, the
        # direction per row is fixed): check the ratio is constant across rows for each channel.
        h = ref[f"{p}.hidden.{L - 1}"].astype(np.float64)
        normed = h / np.sqrt((h * h).mean(-1, keepdims=True) + tc["rms_norm_eps"])
        w = ref[f"{p}.final_hidden"] / normed
        expect(np.allclose(w, w[:1], rtol=1e-4, atol=1e-4), f"{p}: final_hidden is not a norm of hidden.{L - 1}")
        for key, arr in ref.items():
            if arr.dtype == np.float32:
                expect(np.isfinite(arr).all(), f"{key} has non-finite values")
    extra = set(ref) - expected_keys
    expect(not extra, f"unexpected keys {sorted(extra)[:5]}")
    return errors


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "fixtures")
    names = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "reference.json")))
    errors = []
    for n in names:
        errors += check(os.path.join(root, n))
    for e in errors:
        print(e)
    print(f"{len(names)} fixtures checked, {len(errors)} problems")
    return 1 if errors or not names else 0


if __name__ == "__main__":
    sys.exit(main())
