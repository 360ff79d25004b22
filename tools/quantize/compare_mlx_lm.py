#!/usr/bin/env python3
"""Cross-check of `puredrive quantize` against mlx_lm.convert (mlx 0.32.4, mlx-lm 0.32.2, Linux CPU).

For two tiny bf16 checkpoints, qwen3_5_moe (tests/fixtures/qwen35-bf16: nested config, fused experts, a vision
tower to drop) and qwen3_next (tests/fixtures/qwen3next-f32 cast to bf16: fused in_proj_qkvz / in_proj_ba,
per-expert experts), and three recipes (q8 group 64, q4 group 32, and the mixed oq6e, given to mlx_lm.convert as
a quant_predicate), this script converts the checkpoint both ways and requires:

- every tensor mlx-lm writes is in our output, with the same dtype, shape and bytes: quantized codes, scales and
  biases, and also the float tensors (norms with 1 + w folded in, conv1d re-laid out, stacked experts left in
  float because their input width is not a multiple of the group size);
- our only extra tensors are the MTP head's (`mtp.*`, which mlx-lm drops);
- the `quantization` blocks are equal once our `mtp.*` entries are removed;
- mlx-lm, loading our output, generates the same 32 greedy tokens as from its own output (both upcast to
  float32 after loading: mlx's CPU gather_mm, used by the experts left in float, supports only float32).

The random fixtures have no tokenizer, and mlx_lm.convert loads one: the bundled model's tokenizer files are
copied next to them (the tokenizer is not used). qwen3_next: mlx-lm's sanitize passes already stacked weights
through unchanged, so its strict loader would reject our `mtp.*` tensors; our output is therefore loaded with
strict=False, after checking above that the tensor sets differ only by `mtp.*`.

Usage: compare_mlx_lm.py PUREDRIVE_BINARY [WORK_DIR]     (run with the venv of tools/quantize/setup.sh)
Exit status 0 when everything matches.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_lm.convert import convert
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
GREEDY_TOKENS = 32


def oq6e_predicate(path: str, module) -> bool | dict:
    """oq6e as a quant_predicate: routed experts 6-bit, everything else at the global 8 bits (group 64), and the
    router rule of mlx-lm's own qwen3_5 / qwen3_next predicate, which a user predicate replaces."""
    if path.endswith("mlp.gate") or path.endswith("shared_expert_gate"):
        return {"group_size": 64, "bits": 8}
    if ".switch_mlp." in path:
        return {"group_size": 64, "bits": 6}
    return True


RECIPES = {
    "q8": dict(q_bits=8, q_group_size=64, quant_predicate=None),
    "q4": dict(q_bits=4, q_group_size=32, quant_predicate=None),
    "oq6e": dict(q_bits=8, q_group_size=64, quant_predicate=oq6e_predicate),
}
GROUP = {"q8": 64, "q4": 32, "oq6e": 64}


def prepare_inputs(work: Path) -> dict[str, Path]:
    out = {}
    q35 = work / "in-qwen35-bf16"
    q35.mkdir()
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(FIXTURES / "qwen35-bf16" / f, q35 / f)
    out["qwen3_5_moe"] = q35

    nxt = work / "in-qwen3next-bf16"
    nxt.mkdir()
    src = FIXTURES / "qwen3next-f32"
    weights = mx.load(str(src / "model.safetensors"))
    # bf16 like a published checkpoint; A_log stays float32 as in published Qwen3-Next / Qwen3.5 files.
    weights = {k: (v if k.endswith("A_log") else v.astype(mx.bfloat16)) for k, v in weights.items()}
    mx.save_safetensors(str(nxt / "model.safetensors"), weights, metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (nxt / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.copy(src / "generation_config.json", nxt / "generation_config.json")
    out["qwen3_next"] = nxt

    for d in out.values():
        for f in TOKENIZER_FILES:
            shutil.copy(ROOT / "models" / "tiny-coder" / f, d / f)
    return out


def load_tensors(d: Path) -> dict[str, mx.array]:
    t = {}
    for f in sorted(d.glob("*.safetensors")):
        t.update(mx.load(str(f)))
    return t


def as_bytes(a: mx.array) -> bytes:
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.array(a).tobytes()


def greedy(d: Path, prompt: list[int], strict: bool) -> list[int]:
    model, _ = load_model(d, strict=strict)
    # mlx's CPU gather_mm (the float experts left unquantized) runs only in float32: both models are upcast
    # the same way after loading.
    model.update(tree_map(lambda x: x.astype(mx.float32) if x.dtype == mx.bfloat16 else x, model.parameters()))
    cache = make_prompt_cache(model)
    out = model(mx.array(prompt)[None], cache=cache)
    tokens = []
    for _ in range(GREEDY_TOKENS):
        t = int(mx.argmax(out[0, -1]).item())
        tokens.append(t)
        out = model(mx.array([[t]]), cache=cache)
    return tokens


def compare(arch: str, recipe: str, src: Path, work: Path, binary: str, prompt: list[int]) -> list[str]:
    errors: list[str] = []
    ref = work / f"mlx-{arch}-{recipe}"
    ours = work / f"pd-{arch}-{recipe}"
    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), str(ref), quantize=True, **RECIPES[recipe])
    t1 = time.time()
    r = subprocess.run(
        [binary, "quantize", "--model", str(src), "--out", str(ours), "--recipe", recipe, "--group-size",
         str(GROUP[recipe]), "--quiet"],
        capture_output=True, text=True)
    t2 = time.time()
    if r.returncode != 0:
        return [f"puredrive quantize failed: {r.stdout}{r.stderr}"]

    a, b = load_tensors(ref), load_tensors(ours)
    quantized = sum(1 for k in a if k.endswith(".scales"))
    identical = 0
    for k, v in a.items():
        if k not in b:
            errors.append(f"{k}: missing from our output")
            continue
        w = b[k]
        if v.dtype != w.dtype or v.shape != w.shape:
            errors.append(f"{k}: mlx-lm {v.dtype} {v.shape}, ours {w.dtype} {w.shape}")
        elif as_bytes(v) != as_bytes(w):
            errors.append(f"{k}: bytes differ")
        else:
            identical += 1
    extra = sorted(k for k in b if k not in a)
    not_mtp = [k for k in extra if "mtp." not in k]
    if not_mtp:
        errors.append(f"extra tensors that are not MTP: {not_mtp[:8]}")
    mtp_quantized = sum(1 for k in extra if k.endswith(".scales"))

    qa = json.loads((ref / "config.json").read_text())["quantization"]
    qb = json.loads((ours / "config.json").read_text())["quantization"]
    qb_trunk = {k: v for k, v in qb.items() if "mtp." not in k}
    if qa != qb_trunk:
        errors.append(f"quantization blocks differ:\n  mlx-lm {json.dumps(qa, sort_keys=True)}\n"
                      f"  ours   {json.dumps(qb_trunk, sort_keys=True)}")

    g_ref = greedy(ref, prompt, strict=True)
    g_ours = greedy(ours, prompt, strict=(arch != "qwen3_next"))
    if g_ref != g_ours:
        errors.append(f"greedy tokens differ:\n  mlx-lm {g_ref}\n  ours   {g_ours}")
    print(f"{arch:12s} {recipe:5s} tensors {len(a):4d} (quantized modules {quantized:3d}) identical "
          f"{identical:4d}; ours + {len(extra)} mtp.* tensors "
          f"({mtp_quantized} quantized modules); quantization block {'equal' if qa == qb_trunk else 'DIFFERS'}; "
          f"greedy {GREEDY_TOKENS} tokens {'identical' if g_ref == g_ours else 'DIFFER'}; "
          f"mlx_lm.convert {t1 - t0:.1f} s, puredrive quantize {t2 - t1:.1f} s")
    return errors


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = str(Path(sys.argv[1]).resolve())
    keep = len(sys.argv) > 2
    work = Path(sys.argv[2]) if keep else Path(tempfile.mkdtemp(prefix="pd-quantize-mlx-"))
    if keep:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    print(f"mlx {mx.__version__}, mlx-lm {__import__('mlx_lm').__version__}, device {mx.default_device()}")
    inputs = prepare_inputs(work)
    prompts = {
        "qwen3_5_moe": mx.load(str(FIXTURES / "qwen35-bf16" / "reference.safetensors"))["p1.input_ids"],
        "qwen3_next": mx.load(str(FIXTURES / "qwen3next-f32" / "reference.safetensors"))["p1.input_ids"],
    }
    failures = 0
    for arch, src in inputs.items():
        prompt = [int(x) for x in np.array(prompts[arch])]
        for recipe in RECIPES:
            errors = compare(arch, recipe, src, work, binary, prompt)
            for e in errors[:20]:
                print(f"  FAIL {e}")
            failures += len(errors)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    print("all identical" if failures == 0 else f"{failures} mismatches")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
