#!/usr/bin/env python3
"""Writes a random bf16 checkpoint with the real tensor names and shapes of a qwen3_5_moe config (HF layout as
published: fused experts `mlp.experts.gate_up_proj` / `down_proj`, conv1d [C, 1, K], zero-centred norms stored
as w, A_log in float32, an MTP head), for measuring `puredrive quantize` on a large input without downloading
one. Streams: one tensor at a time is generated and written, so it needs little memory.

    python3 tools/quantize/make_synthetic_checkpoint.py --config tests/fixtures/configs/qwen3.5-35b-a3b \\
        --out /tmp/synth-35b [--layers N] [--shard-gb 5]

--layers keeps the first N decoder layers (and the MTP head), to make a smaller file with the same tensor
shapes. Values: normal with std 0.02 (norm weights std 0.1 around 0, A_log = log(U(1, 16))). Needs numpy only.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np


def bf16_bytes(x: np.ndarray) -> bytes:
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
    return u.astype("<u2").tobytes()


def layer_tensors(p: str, t: dict, full: bool) -> list[tuple[str, list[int], str]]:
    H, E, I, Is = t["hidden_size"], t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    out = [(p + "input_layernorm.weight", [H], "norm"), (p + "post_attention_layernorm.weight", [H], "norm")]
    if full:
        D, Hq, Hkv = t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
        out += [(p + "self_attn.q_proj.weight", [Hq * D * 2, H], "w"), (p + "self_attn.k_proj.weight", [Hkv * D, H], "w"),
                (p + "self_attn.v_proj.weight", [Hkv * D, H], "w"), (p + "self_attn.o_proj.weight", [H, Hq * D], "w"),
                (p + "self_attn.q_norm.weight", [D], "norm"), (p + "self_attn.k_norm.weight", [D], "norm")]
    else:
        kd = t["linear_num_key_heads"] * t["linear_key_head_dim"]
        vd = t["linear_num_value_heads"] * t["linear_value_head_dim"]
        Hv, K = t["linear_num_value_heads"], t["linear_conv_kernel_dim"]
        out += [(p + "linear_attn.in_proj_qkv.weight", [2 * kd + vd, H], "w"),
                (p + "linear_attn.in_proj_z.weight", [vd, H], "w"),
                (p + "linear_attn.in_proj_b.weight", [Hv, H], "w"), (p + "linear_attn.in_proj_a.weight", [Hv, H], "w"),
                (p + "linear_attn.conv1d.weight", [2 * kd + vd, 1, K], "w"), (p + "linear_attn.dt_bias", [Hv], "w"),
                (p + "linear_attn.A_log", [Hv], "alog"), (p + "linear_attn.norm.weight", [t["linear_value_head_dim"]], "one"),
                (p + "linear_attn.out_proj.weight", [H, vd], "w")]
    out += [(p + "mlp.gate.weight", [E, H], "w"), (p + "mlp.experts.gate_up_proj", [E, 2 * I, H], "w"),
            (p + "mlp.experts.down_proj", [E, H, I], "w"), (p + "mlp.shared_expert.gate_proj.weight", [Is, H], "w"),
            (p + "mlp.shared_expert.up_proj.weight", [Is, H], "w"),
            (p + "mlp.shared_expert.down_proj.weight", [H, Is], "w"), (p + "mlp.shared_expert_gate.weight", [1, H], "w")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="config.json or a directory holding one")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg_path = Path(a.config)
    if cfg_path.is_dir():
        cfg_path = cfg_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    nested = "text_config" in cfg
    t = cfg["text_config"] if nested else cfg
    if a.layers:
        t["num_hidden_layers"] = a.layers
        if "layer_types" in t:
            t["layer_types"] = t["layer_types"][: a.layers]
    n = t["num_hidden_layers"]
    types = t.get("layer_types") or [
        "full_attention" if (i + 1) % t["full_attention_interval"] == 0 else "linear_attention" for i in range(n)]
    pre = "model.language_model." if nested else "model."
    H, V = t["hidden_size"], t["vocab_size"]
    tensors = [(pre + "embed_tokens.weight", [V, H], "w")]
    for i in range(n):
        tensors += layer_tensors(f"{pre}layers.{i}.", t, types[i] == "full_attention")
    tensors += [(pre + "norm.weight", [H], "norm"), ("lm_head.weight", [V, H], "w")]
    for j in range(t.get("mtp_num_hidden_layers", 1)):
        tensors += layer_tensors(f"mtp.layers.{j}.", t, True)
    tensors += [("mtp.fc.weight", [H, 2 * H], "w"), ("mtp.pre_fc_norm_embedding.weight", [H], "norm"),
                ("mtp.pre_fc_norm_hidden.weight", [H], "norm"), ("mtp.norm.weight", [H], "norm")]

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    limit = int(a.shard_gb * (1 << 30))
    shards: list[list] = [[]]
    size = 0
    for name, shape, kind in tensors:
        nbytes = int(np.prod(shape)) * (4 if kind == "alog" else 2)
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, kind, nbytes))
        size += nbytes
    rng = np.random.default_rng(a.seed)
    weight_map = {}
    total = 0
    for s, items in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        # float32 tensors first keep every tensor aligned to its element size.
        items.sort(key=lambda x: x[2] != "alog")
        for name, shape, kind, nbytes in items:
            header[name] = {"dtype": "F32" if kind == "alog" else "BF16", "shape": shape,
                            "data_offsets": [off, off + nbytes]}
            off += nbytes
            weight_map[name] = fname
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(out / fname, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for name, shape, kind, nbytes in items:
                count = int(np.prod(shape))
                if kind == "alog":
                    f.write(np.log(rng.uniform(1, 16, count)).astype("<f4").tobytes())
                    continue
                step = 1 << 24
                for b in range(0, count, step):
                    m = min(step, count - b)
                    x = rng.standard_normal(m, dtype=np.float32)
                    x *= 0.1 if kind == "norm" else 0.02
                    if kind == "one":
                        x += 1.0
                    f.write(bf16_bytes(x))
        total += off
        print(f"wrote {out / fname} ({off / 1e9:.2f} GB)")
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    print(f"{len(tensors)} tensors, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
