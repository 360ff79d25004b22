#!/usr/bin/env python3
"""Writes tests/fixtures/mlx-quantize/mlx_quantize_reference.safetensors: mx.quantize's own output for a small
matrix, for every bit width (2, 3, 4, 5, 6, 8), group size (32, 64, 128) and input dtype (bfloat16, float16,
float32). The C++ test (src/puredrive/checkpoint/quantize_test.cpp) requires byte-identical codes, scales and
biases from quantize_affine_mlx.

The matrix is random normal with a few groups that hit MLX's edge cases: an all-zero group (q0 = 0, bias 0), a
constant group (scale clamped to 1e-7), groups dominated by their minimum or by their maximum (the sign of the
scale), codes that land exactly on .5 (round half to even) and large and tiny magnitudes.

Run with the venv of tools/quantize/setup.sh:  tools/quantize/.venv/bin/python tools/quantize/make_mlx_reference.py
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

ROWS, COLS = 6, 256


def matrix() -> np.ndarray:
    rng = np.random.default_rng(18)
    w = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    w[0, 0:32] = 0.0  # all zero
    w[0, 32:64] = 0.75  # constant
    w[1, 0:32] = -np.arange(32, dtype=np.float32) / 2  # minimum dominates, exact steps
    w[1, 32:64] = np.arange(32, dtype=np.float32)  # maximum dominates, .5 ties under 4 bits
    w[2, 0:128] *= 1e3  # large
    w[2, 128:256] *= 1e-4  # tiny
    w[3, 0:64] = np.abs(w[3, 0:64])  # one-signed
    w[4, 64:128] = -np.abs(w[4, 64:128])
    return w


def main() -> None:
    root = Path(__file__).resolve().parents[2]
    out = root / "tests" / "fixtures" / "mlx-quantize" / "mlx_quantize_reference.safetensors"
    w32 = matrix()
    arrays = {}
    for name, dt in (("bf16", mx.bfloat16), ("f16", mx.float16), ("f32", mx.float32)):
        w = mx.array(w32).astype(dt)
        arrays[f"w.{name}"] = w
        for bits in (2, 3, 4, 5, 6, 8):
            for group in (32, 64, 128):
                q, s, b = mx.quantize(w, group_size=group, bits=bits)
                key = f"{name}.b{bits}.g{group}"
                arrays[f"{key}.weight"] = q
                arrays[f"{key}.scales"] = s
                arrays[f"{key}.biases"] = b
    mx.eval(arrays)
    mx.save_safetensors(str(out), arrays, metadata={"mlx": mx.__version__, "generator": "make_mlx_reference.py"})
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(arrays)} tensors, mlx {mx.__version__})")


if __name__ == "__main__":
    main()
