#!/usr/bin/env python3
"""Optional cross-check of a fixture against mlx-lm, an implementation independent of transformers.

Not part of `make fixtures`, and not a project dependency. Run it in a separate venv:
    python3 -m venv /tmp/mlxvenv && /tmp/mlxvenv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2"
    /tmp/mlxvenv/bin/python tools/reference/cross_check_mlx_lm.py tests/fixtures/qwen35-mlx-q [--bf16]

By default the model's bfloat16 tensors are upcast to float32 after loading, so that the comparison is float32 vs
float32. mlx-lm 0.32.2 reads qwen3_5_moe (nested config, HF or MLX layout) and qwen3_next. It does not read
qwen3_5_moe_text, and it has no MTP head.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model
from safetensors.numpy import load_file


def main() -> int:
    d = Path(sys.argv[1])
    keep_bf16 = "--bf16" in sys.argv[2:]
    model, _ = load_model(d)
    if not keep_bf16:
        model.update(tree_map(lambda x: x.astype(mx.float32) if x.dtype == mx.bfloat16 else x, model.parameters()))
    ref = load_file(str(d / "reference.safetensors"))
    meta = json.loads((d / "reference.json").read_text())
    worst = 0.0
    for p in meta["prompts"]:
        ids = ref[f"{p}.input_ids"].astype(np.int32)
        logits = np.array(model(mx.array(ids)[None]).astype(mx.float32))[0]
        r = ref[f"{p}.logits"]
        err = float(np.abs(logits - r).max() / np.abs(r).max())
        worst = max(worst, err)
        cache = make_prompt_cache(model)
        out = model(mx.array(ids)[None], cache=cache)
        tokens = []
        for _ in range(meta["greedy_tokens"]):
            t = int(np.argmax(np.array(out[0, -1].astype(mx.float32))))
            tokens.append(t)
            out = model(mx.array([[t]]), cache=cache)
        same = tokens == ref[f"{p}.greedy"].tolist()
        print(f"{d.name} {p} T={len(ids)}: logits rel err {err:.3g}, greedy identical: {same}")
    return 0 if worst <= meta["tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
