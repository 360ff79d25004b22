#!/usr/bin/env python3
"""mlx-lm reads what `puredrive synth --write` writes in the MLX layout (mlx 0.32.4, mlx-lm 0.32.2, Linux CPU).

For the tiny architecture with recipes q8 (group 32) and oq6e, this script writes the synthetic checkpoint with
`puredrive synth --write`, loads it with mlx-lm's own loader (strict: every tensor mlx-lm's model expects is
there with its shape; our extra `mtp.*` tensors are dropped by its sanitize), and requires that mlx-lm's logits
for a prompt agree with `puredrive generate --logits-out` on the same files (relative error below 1e-3: both
dequantize w = scale * q + bias and compute in float32), and that both pick the same next token. mlx-lm is an
independent reader of the format: a wrong name, shape, packing or quantization entry fails here.

Usage: check_synth_mlx_lm.py PUREDRIVE_BINARY      (run with the venv of tools/quantize/setup.sh)
Exit status 0 when everything matches.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_lm.utils import load_model

PROMPT = [3, 17, 101, 42, 250, 9, 77, 128, 5, 199, 64, 31]
RECIPES = ("q8", "oq6e")


def mlx_logits(d: Path) -> np.ndarray:
    model, _ = load_model(d, strict=True)
    # mlx's CPU gather_mm (experts left in float when the group does not divide their width) runs only in
    # float32; puredrive computes in float32 too.
    model.update(tree_map(lambda x: x.astype(mx.float32) if x.dtype == mx.bfloat16 else x, model.parameters()))
    out = model(mx.array(PROMPT)[None])
    return np.array(out[0, -1].astype(mx.float32))


def puredrive_logits(binary: str, d: Path) -> np.ndarray:
    path = d / "logits.f32"
    ids = ",".join(str(t) for t in PROMPT)
    r = subprocess.run([binary, "generate", "--model", str(d), "--backend", "cpu", "--prompt-ids", ids, "-n", "1",
                        "--temp", "0", "--no-mtp", "--ignore-eos", "--logits-out", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"puredrive generate failed: {r.stdout}{r.stderr}")
    return np.fromfile(path, dtype=np.float32)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = str(Path(sys.argv[1]).resolve())
    print(f"mlx {mx.__version__}, mlx-lm {__import__('mlx_lm').__version__}, device {mx.default_device()}")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="pd-synth-mlx-") as work:
        for recipe in RECIPES:
            d = Path(work) / f"tiny-{recipe}"
            r = subprocess.run([binary, "synth", "--arch", "tiny", "--quant", recipe, "--seed", "3", "--write", str(d),
                                "--quiet"], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{recipe}: synth --write failed: {r.stdout}{r.stderr}")
                failures += 1
                continue
            try:
                ref = mlx_logits(d)
            except Exception as e:  # noqa: BLE001: any loader error is the finding
                print(f"{recipe}: mlx-lm cannot load the written checkpoint: {type(e).__name__}: {e}")
                failures += 1
                continue
            ours = puredrive_logits(binary, d)
            err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref))) if ours.shape == ref.shape else float("inf")
            same = int(np.argmax(ours)) == int(np.argmax(ref))
            ok = err < 1e-3 and same
            failures += 0 if ok else 1
            print(f"tiny {recipe:5s}: mlx-lm loads it (strict); logits vs puredrive: max rel err {err:.2e}, "
                  f"argmax {'equal' if same else 'DIFFERS'} -> {'ok' if ok else 'FAIL'}")
    print("PASS" if failures == 0 else f"FAIL ({failures})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
