#!/usr/bin/env python3
"""Generates the golden fixtures in tests/fixtures/<name>/ (format: tests/fixtures/FORMAT.md).

Each fixture is a tiny checkpoint with random weights, written in one of the on-disk layouts the engine must read,
plus reference outputs computed with transformers' own model classes (CPU, float32, deterministic) and the MTP head
of mtp_reference.py. Re-running produces bit-identical files.

Usage: make_fixtures.py [--out DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import zlib

import numpy as np
import torch

# Determinism first: one thread (fixed reduction order), deterministic kernels, no TF32-like shortcuts.
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.backends.mkldnn.enabled = False

import safetensors  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_affine  # noqa: E402
from mtp_reference import MtpHead, mtp_state_dict_names  # noqa: E402

PROMPT_LENGTHS = (1, 7, 110)
GREEDY_TOKENS = 64
MTP_CHAIN = 3
# Self-consistency bounds checked while generating (relative to max |reference|).
CACHED_VS_UNCACHED_TOL = 1e-4
MTP_INCREMENTAL_TOL = 1e-5
# Smallest allowed gap between the top-1 and top-2 logit wherever a reference token is an argmax.
MIN_ARGMAX_MARGIN = 2e-3
# Smallest allowed gap between the k-th and (k+1)-th router logit in any routing decision of the reference.
MIN_ROUTER_GAP = 5e-4
SAFETENSORS_META = {"format": "pt"}


@dataclasses.dataclass(frozen=True)
class Fixture:
    name: str
    family: str  # "qwen3_5_moe" | "qwen3_next"
    layout: str  # "nested" | "flat" | "next" | "mlx"
    seed: int
    vocab: int = 256
    layers: int = 4
    moe_intermediate: int = 16  # MLX fixture: 32, so that the experts' down_proj (in = I) can be quantized
    weights_dtype: str = "float32"  # "float32" | "bfloat16" | "mlx-affine"
    mtp_per_expert: bool = True
    shards: int = 1
    tolerance: float = 1e-4
    description: str = ""


FIXTURES = [
    Fixture(
        "qwen35-nested-f32",
        "qwen3_5_moe",
        "nested",
        seed=1001,
        description="qwen3_5_moe, nested multimodal naming (model.language_model.*, model.visual.*), fused main "
        "experts, per-expert MTP experts (like Qwen3.5-35B-A3B), float32",
    ),
    Fixture(
        "qwen35-text-f32",
        "qwen3_5_moe",
        "flat",
        seed=1002,
        mtp_per_expert=False,
        shards=2,
        description="qwen3_5_moe_text, flat naming (model.*), fused experts in main and MTP layers "
        "(like Qwen3.6), float32, 2 shards + model.safetensors.index.json",
    ),
    Fixture(
        "qwen3next-f32",
        "qwen3_next",
        "next",
        seed=1003,
        layers=8,
        description="qwen3_next, fused in_proj_qkvz / in_proj_ba, per-expert experts (main and MTP), legacy "
        "rope_theta / partial_rotary_factor config fields, no layer_types (full_attention_interval), float32",
    ),
    Fixture(
        "qwen35-mlx-q",
        "qwen3_5_moe",
        "mlx",
        seed=1004,
        weights_dtype="mlx-affine",
        moe_intermediate=32,
        description="qwen3_5_moe in mlx-lm's sanitized layout (language_model.model.*, switch_mlp, conv1d [C,K,1], "
        "norms with +1 folded, A_log float32), MLX affine quantization 4/6/8 bits, group sizes 32/64/128, "
        "per-module overrides; MTP head at language_model.mtp.*, quantized too; float tensors bfloat16",
    ),
    Fixture(
        "qwen35-smallvocab-f32",
        "qwen3_5_moe",
        "flat",
        seed=1005,
        vocab=48,
        description="qwen3_5_moe_text, flat naming, vocab 48 (for distribution tests), per-expert MTP experts, "
        "float32",
    ),
    Fixture(
        "qwen35-bf16",
        "qwen3_5_moe",
        "nested",
        seed=1006,
        weights_dtype="bfloat16",
        tolerance=2e-2,
        description="qwen3_5_moe nested naming, weights stored in bfloat16 (A_log float32); the reference runs "
        "in float32 on the bfloat16-rounded weights",
    ),
]

# --------------------------------------------------------------------------------------------------------------
# Configs


def text_config_dict(fx: Fixture) -> dict:
    """The text fields, as they appear in config.json (text_config for nested, top level for flat)."""
    v = fx.vocab
    d = {
        "vocab_size": v,
        "hidden_size": 64,
        "num_hidden_layers": fx.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": fx.moe_intermediate,
        "shared_expert_intermediate_size": fx.moe_intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "full_attention_interval": 4,
        "initializer_range": 0.02,
        "eos_token_id": v - 1,
        "router_aux_loss_coef": 0.001,
    }
    if fx.family == "qwen3_5_moe":
        d.update(
            {
                "model_type": "qwen3_5_moe_text",
                "layer_types": [
                    "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(fx.layers)
                ],
                "attn_output_gate": True,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [1, 1, 2],
                    "mrope_interleaved": True,
                },
                "mtp_num_hidden_layers": 1,
                "mtp_use_dedicated_embeddings": False,
                "mamba_ssm_dtype": "float32",
                "dtype": "bfloat16" if fx.weights_dtype != "float32" else "float32",
            }
        )
    else:
        # Written like the published Qwen3-Next config.json: legacy top-level rope fields, no layer_types.
        d.update(
            {
                "model_type": "qwen3_next",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "rope_scaling": None,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "norm_topk_prob": True,
                "intermediate_size": 96,
                "bos_token_id": v - 2,
                "dtype": "float32",
            }
        )
    return d


VISION_CONFIG = {
    "model_type": "qwen3_5_moe_vision",
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
}


def config_json(fx: Fixture) -> dict:
    text = text_config_dict(fx)
    version = transformers.__version__
    if fx.layout == "nested":
        return {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "text_config": text,
            "vision_config": dict(VISION_CONFIG),
            "image_token_id": 248056,
            "video_token_id": 248057,
            "vision_start_token_id": 248053,
            "vision_end_token_id": 248054,
            "tie_word_embeddings": False,
            "transformers_version": version,
        }
    if fx.layout == "mlx":
        # mlx-lm keeps the nested text_config, drops vision_config and adds the quantization block (twice).
        q = mlx_quantization_block(fx)
        return {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "text_config": text,
            "tie_word_embeddings": False,
            "quantization": q,
            "quantization_config": q,
            "transformers_version": version,
        }
    if fx.family == "qwen3_next":
        return {"architectures": ["Qwen3NextForCausalLM"], **text, "transformers_version": version}
    return {"architectures": ["Qwen3_5MoeForCausalLM"], **text, "transformers_version": version}


def build_model(fx: Fixture):
    """Returns (model, text_model, lm_head, text_config, mtp)."""
    text = text_config_dict(fx)
    text = {k: v for k, v in text.items() if k not in ("dtype",)}
    if fx.family == "qwen3_next":
        cfg = Qwen3NextConfig(**text)
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        model = Qwen3NextForCausalLM(cfg)
        tcfg = cfg
        text_model, lm_head = model.model, model.lm_head
    elif fx.layout == "nested":
        cfg = Qwen3_5MoeConfig(text_config=text, vision_config=dict(VISION_CONFIG))
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
            c._experts_implementation = "eager"
        model = Qwen3_5MoeForConditionalGeneration(cfg)
        tcfg = cfg.text_config
        text_model, lm_head = model.model.language_model, model.lm_head
    else:
        cfg = Qwen3_5MoeTextConfig(**text)
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        model = Qwen3_5MoeForCausalLM(cfg)
        tcfg = cfg
        text_model, lm_head = model.model, model.lm_head
    model.eval()
    mtp = MtpHead(fx.family, tcfg).eval()
    return model, text_model, lm_head, tcfg, mtp


# --------------------------------------------------------------------------------------------------------------
# Random weights


def _std_normal(name: str, seed: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32)


def _uniform(name: str, seed: int, shape, lo: float, hi: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}:u".encode()))
    return lo + (hi - lo) * torch.rand(tuple(shape), generator=g, dtype=torch.float32)


def random_weight(name: str, shape, seed: int, hidden: int) -> torch.Tensor:
    """A weight with a scale that keeps activations O(1) and exercises every path (no identity norms, non-trivial
    router logits, GDN decay away from 0 and 1). `name` is the in-memory (transformers) parameter name."""
    n = _std_normal(name, seed, shape)
    if name.startswith("model.visual.") or ".visual." in name:
        return 0.02 * n
    if name.endswith("embed_tokens.weight"):
        return n
    if name.endswith("lm_head.weight"):
        return n * (2.0 / hidden**0.5)
    if name.endswith("linear_attn.norm.weight"):  # plain (not zero-centred) gated-norm weight
        return 1.0 + 0.25 * n
    if len(shape) == 1 and name.endswith(".weight") and "norm" in name.split(".")[-2]:  # zero-centred: (1 + w)
        return 0.25 * n
    if name.endswith("A_log"):
        return torch.log(_uniform(name, seed, shape, 0.05, 1.5))
    if name.endswith("dt_bias"):
        return 0.5 * n
    if name.endswith("conv1d.weight"):
        return 0.5 * n
    if name.endswith("mlp.gate.weight"):  # router: logits with std ~2
        return n * (2.0 / shape[-1] ** 0.5)
    if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
        return n / shape[-1] ** 0.5
    if len(shape) == 2:  # every other linear [out, in]
        return n / shape[-1] ** 0.5
    raise ValueError(f"no init rule for {name} {tuple(shape)}")


@torch.no_grad()
def init_weights(fx: Fixture, model, mtp, hidden: int) -> None:
    for name, p in sorted(model.state_dict(keep_vars=True).items()):
        if p.dtype.is_floating_point:
            p.copy_(random_weight(name, p.shape, fx.seed, hidden))
    for name, p in sorted(mtp.state_dict(keep_vars=True).items()):
        if name.startswith("rotary_emb."):
            continue
        p.copy_(random_weight("mtp." + name, p.shape, fx.seed, hidden))
    if fx.weights_dtype == "bfloat16":
        round_params_to(model, mtp, torch.bfloat16, keep_f32=("A_log",))


@torch.no_grad()
def round_params_to(model, mtp, dtype, keep_f32=()) -> None:
    for mod in (model, mtp):
        for name, p in mod.state_dict(keep_vars=True).items():
            if p.dtype.is_floating_point and not name.endswith(keep_f32) and "rotary_emb" not in name:
                p.copy_(p.to(dtype).to(torch.float32))


# --------------------------------------------------------------------------------------------------------------
# Reference outputs


def prompt_ids(fx: Fixture, length: int, attempt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(fx.seed * 100000 + length * 100 + attempt)
    # Valid ids, avoiding the two highest ids (eos = V-1; V-2 is reserved as bos/pad in some configs).
    return torch.randint(0, fx.vocab - 2, (length,), generator=g, dtype=torch.int64)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def top2_margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits, 2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


class RouterGapProbe:
    """Records the smallest gap between the k-th and (k+1)-th router logit over every routing decision made while
    active: a near tie there would let an engine that is within tolerance pick a different expert."""

    def __init__(self, *modules):
        self.min_gap = float("inf")
        self._hooks = []
        for mod in modules:
            for m in mod.modules():
                if type(m).__name__.endswith("TopKRouter"):
                    self._hooks.append(m.register_forward_hook(self._hook))

    def _hook(self, module, args, output):
        logits = output[0].float()
        top = torch.topk(logits, module.top_k + 1, dim=-1).values
        self.min_gap = min(self.min_gap, float((top[:, -2] - top[:, -1]).min()))

    def close(self):
        for h in self._hooks:
            h.remove()


@torch.no_grad()
def run_prompt(fx: Fixture, model, text_model, lm_head, mtp, ids: torch.Tensor, pname: str, stats: dict) -> dict:
    T = ids.numel()
    out: dict[str, torch.Tensor] = {f"{pname}.input_ids": ids.to(torch.int32)}

    # 1. One uncached forward over the prompt; hidden states via hooks so the definitions are exactly FORMAT.md's.
    captured: dict[str, torch.Tensor] = {}
    hooks = []
    for li, layer in enumerate(text_model.layers):
        hooks.append(layer.register_forward_hook(lambda m, a, o, li=li: captured.__setitem__(f"h{li}", o)))
    hooks.append(text_model.norm.register_forward_hook(lambda m, a, o: captured.__setitem__("final", o)))
    logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
    for h in hooks:
        h.remove()
    for li in range(len(text_model.layers)):
        out[f"{pname}.hidden.{li}"] = captured[f"h{li}"][0].float().clone()
    final_hidden = captured["final"][0].float().clone()
    out[f"{pname}.final_hidden"] = final_hidden
    out[f"{pname}.logits"] = logits.clone()
    # The hooks must see what lm_head sees.
    assert torch.equal(lm_head(final_hidden), logits), "final_hidden hook does not feed lm_head"

    # 2. Greedy continuation through transformers' own generate (cached prefill, then 1-token cached decode).
    gen = model.generate(
        input_ids=ids[None],
        attention_mask=torch.ones(1, T, dtype=torch.long),
        do_sample=False,
        max_new_tokens=GREEDY_TOKENS,
        min_new_tokens=GREEDY_TOKENS,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    greedy = gen.sequences[0, T:]
    assert greedy.numel() == GREEDY_TOKENS
    cached_logits = torch.stack([x[0] for x in gen.logits]).float()

    # Self-consistency: the uncached forward over prompt + greedy[:-1] gives the same argmax and logits.
    full = torch.cat([ids, greedy[:-1]])
    probe = RouterGapProbe(model, mtp)
    full_logits = model(input_ids=full[None], use_cache=False).logits[0, T - 1 :].float()
    assert torch.equal(full_logits.argmax(-1), greedy), f"{fx.name}/{pname}: uncached argmax != cached greedy"
    err = rel_err(cached_logits, full_logits)
    assert err < CACHED_VS_UNCACHED_TOL, f"{fx.name}/{pname}: cached vs uncached logits rel err {err}"
    out[f"{pname}.greedy"] = greedy.to(torch.int32)

    # 3. MTP over the prompt: row i = (token x_{i+1}, final_hidden[i], position i); last row token = greedy[0].
    next_tokens = torch.cat([ids[1:], greedy[:1]])
    emb = text_model.embed_tokens(next_tokens).float()
    positions = torch.arange(T)
    cache = mtp.new_cache()
    mtp_logits, mtp_hidden = mtp(emb, final_hidden, positions, cache, lm_head)
    out[f"{pname}.mtp.logits"] = mtp_logits.clone()
    out[f"{pname}.mtp.hidden"] = mtp_hidden.clone()

    chain_tokens, chain_logits = [], []
    step_logits, step_hidden = mtp_logits[-1], mtp_hidden[-1]
    for j in range(1, MTP_CHAIN + 1):
        if j > 1:
            tok = chain_tokens[-1].view(1)
            step_logits, step_hidden = mtp(
                text_model.embed_tokens(tok).float(),
                step_hidden.view(1, -1),
                torch.tensor([T - 1 + (j - 1)]),
                cache,
                lm_head,
            )
            step_logits, step_hidden = step_logits[0], step_hidden[0]
        chain_logits.append(step_logits.clone())
        chain_tokens.append(step_logits.argmax())
    probe.close()
    out[f"{pname}.mtp.chain_tokens"] = torch.stack(chain_tokens).to(torch.int32)
    out[f"{pname}.mtp.chain_logits"] = torch.stack(chain_logits)

    # Self-consistency of the MTP head: row by row (and in chunks of 3) through its cache equals the single pass.
    for chunk in (1, 3):
        c2 = mtp.new_cache()
        parts_l, parts_h = [], []
        for s in range(0, T, chunk):
            e = min(T, s + chunk)
            lg, hd = mtp(emb[s:e], final_hidden[s:e], positions[s:e], c2, lm_head)
            parts_l.append(lg)
            parts_h.append(hd)
        inc_l, inc_h = torch.cat(parts_l), torch.cat(parts_h)
        e1, e2 = rel_err(inc_l, mtp_logits), rel_err(inc_h, mtp_hidden)
        assert e1 < MTP_INCREMENTAL_TOL and e2 < MTP_INCREMENTAL_TOL, f"MTP incremental mismatch {e1} {e2}"
        stats.setdefault("mtp_incremental_rel_err", 0.0)
        stats["mtp_incremental_rel_err"] = max(stats["mtp_incremental_rel_err"], e1, e2)

    stats.setdefault("cached_vs_uncached_rel_err", 0.0)
    stats["cached_vs_uncached_rel_err"] = max(stats["cached_vs_uncached_rel_err"], err)
    stats.setdefault("greedy_min_top2_margin", {})[pname] = top2_margin(full_logits)
    stats.setdefault("mtp_chain_min_top2_margin", {})[pname] = top2_margin(torch.stack(chain_logits))
    stats.setdefault("greedy_distinct_tokens", {})[pname] = int(torch.unique(greedy).numel())
    stats.setdefault("router_min_topk_gap", {})[pname] = probe.min_gap
    return out


# --------------------------------------------------------------------------------------------------------------
# Checkpoint writers


def split_experts(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Fused `...mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I] -> per-expert `.weight` tensors."""
    out = {}
    if name.endswith("experts.gate_up_proj"):
        base = name[: -len("gate_up_proj")]
        inter = t.shape[1] // 2
        for e in range(t.shape[0]):
            out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
            out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
    else:
        base = name[: -len("down_proj")]
        for e in range(t.shape[0]):
            out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
    return out


def hf_checkpoint_tensors(fx: Fixture, model, mtp) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    main_per_expert = fx.family == "qwen3_next"
    for name, t in model.state_dict().items():
        if "rotary_emb" in name:
            continue
        t = t.detach().clone()
        if main_per_expert and (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
            tensors.update(split_experts(name, t))
        else:
            tensors[name] = t
    mtp_tensors = mtp_state_dict_names(fx.family, mtp.config.num_experts, fx.mtp_per_expert, mtp)
    tensors.update({k: v.detach().clone() for k, v in mtp_tensors.items()})
    if fx.weights_dtype == "bfloat16":
        tensors = {k: (v if k.endswith("A_log") else v.to(torch.bfloat16)) for k, v in tensors.items()}
    return dict(sorted(tensors.items()))


def write_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, path, metadata=SAFETENSORS_META)


def write_checkpoint_files(fx: Fixture, outdir: str, tensors: dict[str, torch.Tensor]) -> None:
    if fx.shards == 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), tensors)
        return
    # Split by name: the main layers in the first shard, embeddings / head / norm / MTP in the last one, so that
    # one module's tensors never need to be on one shard by accident of ordering.
    names = sorted(tensors)
    first = [n for n in names if ".layers." in n and not n.startswith("mtp.")]
    rest = [n for n in names if n not in set(first)]
    groups = [first, rest]
    assert fx.shards == 2
    weight_map = {}
    total = 0
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{fx.shards:05d}.safetensors"
        write_safetensors(os.path.join(outdir, fname), {n: tensors[n] for n in group})
        for n in group:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(os.path.join(outdir, "model.safetensors.index.json"), index)


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


# --------------------------------------------------------------------------------------------------------------
# MLX layout + affine quantization


def mlx_quantization_block(fx: Fixture) -> dict:
    """Global 4-bit, group 32 (two groups per row for the H=64 inputs) plus per-module overrides, keyed by the
    module paths after mlx-lm's sanitize."""
    p = "language_model.model.layers"
    q: dict = {"group_size": 32, "bits": 4, "mode": "affine"}
    for lp in [f"{p}.{i}" for i in range(fx.layers)] + ["language_model.mtp.layers.0"]:
        # Like mlx-lm's qwen3_5 quant_predicate: router and shared-expert gate at 8 bits, group 64.
        q[f"{lp}.mlp.gate"] = {"group_size": 64, "bits": 8}
        q[f"{lp}.mlp.shared_expert_gate"] = {"group_size": 64, "bits": 8}
    q[f"{p}.1.linear_attn.in_proj_qkv"] = {"group_size": 32, "bits": 6}
    q[f"{p}.1.linear_attn.out_proj"] = {"group_size": 64, "bits": 8}
    q[f"{p}.1.mlp.switch_mlp.down_proj"] = {"group_size": 32, "bits": 6}
    q[f"{p}.2.linear_attn.in_proj_b"] = False
    q[f"{p}.2.mlp.shared_expert.down_proj"] = False
    q[f"{p}.2.mlp.switch_mlp.gate_proj"] = {"group_size": 64, "bits": 6}
    q[f"{p}.3.self_attn.k_proj"] = {"group_size": 32, "bits": 6}
    q[f"{p}.3.self_attn.v_proj"] = {"group_size": 64, "bits": 8}
    q[f"{p}.3.self_attn.o_proj"] = {"group_size": 128, "bits": 4}
    q["language_model.lm_head"] = {"group_size": 32, "bits": 6}
    q["language_model.mtp.fc"] = {"group_size": 32, "bits": 8}
    q["language_model.mtp.layers.0.self_attn.o_proj"] = {"group_size": 64, "bits": 6}
    q["language_model.mtp.layers.0.mlp.switch_mlp.up_proj"] = {"group_size": 64, "bits": 6}
    return q


def mlx_module_quant(fx: Fixture, path: str, in_dim: int, qblock: dict):
    """Returns (bits, group_size) or None (float) for an MLX module path."""
    if path in qblock:
        v = qblock[path]
        if v is False:
            return None
        return v["bits"], v["group_size"]
    if path.endswith("layers.0.linear_attn.in_proj_a"):
        return None  # float by absence of .scales, without an override
    if in_dim % qblock["group_size"] != 0:
        return None
    return qblock["bits"], qblock["group_size"]


_NORM_SUFFIXES = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    ".pre_fc_norm_hidden.weight",
    ".pre_fc_norm_embedding.weight",
    "mtp.norm.weight",
)


@torch.no_grad()
def mlx_convert(fx: Fixture, model, mtp):
    """Quantizes the in-memory weights to the MLX layout, writes the dequantised values back into the model (so the
    reference runs on exactly what the checkpoint holds) and returns the MLX tensors."""
    qblock = mlx_quantization_block(fx)
    out: dict[str, torch.Tensor] = {}
    dequantised: dict[str, np.ndarray] = {}

    def hf_to_mlx(name: str) -> str:
        if name.startswith("mtp."):
            return "language_model." + name
        if name == "lm_head.weight":
            return "language_model.lm_head.weight"
        assert name.startswith("model.")
        return "language_model." + name

    def put_float(mname: str, t: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
        out[mname] = t.to(dtype).contiguous()
        return out[mname].to(torch.float32)

    def put_linear(mpath: str, w: torch.Tensor) -> torch.Tensor:
        """w: [..., out, in] float32. Returns the float32 weight the reference must use."""
        spec = mlx_module_quant(fx, mpath, w.shape[-1], qblock)
        if spec is None:
            return put_float(mpath + ".weight", w)
        bits, gs = spec
        packed, scales, biases = mlx_affine.quantize(w.numpy(), bits, gs)
        out[mpath + ".weight"] = torch.from_numpy(packed)
        out[mpath + ".scales"] = torch.from_numpy(scales.astype(np.float32)).to(torch.bfloat16)
        out[mpath + ".biases"] = torch.from_numpy(biases.astype(np.float32)).to(torch.bfloat16)
        deq = mlx_affine.dequantize(
            packed, out[mpath + ".scales"].float().numpy(), out[mpath + ".biases"].float().numpy(), bits, gs
        )
        dequantised[mpath] = deq
        return torch.from_numpy(deq)

    for mod, prefix in ((model, ""), (mtp, "mtp.")):
        params = dict(mod.state_dict(keep_vars=True))
        for name in sorted(params):
            if "rotary_emb" in name:
                continue
            p = params[name]
            full = prefix + name
            mname = hf_to_mlx(full)
            if full.endswith("experts.gate_up_proj"):
                inter = p.shape[1] // 2
                base = mname[: -len("experts.gate_up_proj")] + "switch_mlp."
                g = put_linear(base + "gate_proj", p[:, :inter].clone())
                u = put_linear(base + "up_proj", p[:, inter:].clone())
                p.copy_(torch.cat([g, u], dim=1))
            elif full.endswith("experts.down_proj"):
                base = mname[: -len("experts.down_proj")] + "switch_mlp."
                p.copy_(put_linear(base + "down_proj", p.clone()))
            elif full.endswith("A_log"):
                put_float(mname, p, torch.float32)
            elif full.endswith("conv1d.weight"):  # HF [C, 1, K] -> MLX [C, K, 1]
                stored = put_float(mname, p.movedim(2, 1))
                p.copy_(stored.movedim(1, 2))
            elif full.endswith(_NORM_SUFFIXES):  # zero-centred: MLX stores 1 + w (rounded to bf16)
                stored = put_float(mname, 1.0 + p)
                p.copy_(stored - 1.0)
            elif p.dim() == 1:  # dt_bias, the GDN gated-norm weight (not shifted)
                p.copy_(put_float(mname, p))
            else:
                assert mname.endswith(".weight"), mname
                p.copy_(put_linear(mname[: -len(".weight")], p.clone()))
    return dict(sorted(out.items())), dequantised


# --------------------------------------------------------------------------------------------------------------
# Round-trip checks on the written files


@torch.no_grad()
def check_hf_roundtrip(fx: Fixture, outdir: str, ids: torch.Tensor, expected_logits: torch.Tensor) -> None:
    """Loads the written checkpoint with transformers' own loader and checks it reproduces the logits."""
    kw = dict(dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    if fx.family == "qwen3_next":
        m = Qwen3NextForCausalLM.from_pretrained(outdir, **kw)
    elif fx.layout == "nested":
        m = Qwen3_5MoeForConditionalGeneration.from_pretrained(outdir, **kw)
    else:
        m = Qwen3_5MoeForCausalLM.from_pretrained(outdir, **kw)
    m.eval()
    got = m(input_ids=ids[None], use_cache=False).logits[0].float()
    err = rel_err(got, expected_logits)
    assert err < 1e-6, f"{fx.name}: reloaded checkpoint logits differ (rel err {err})"


def check_mlx_roundtrip(fx: Fixture, outdir: str, dequantised: dict) -> None:
    """Reads the MLX file back, takes bits / group size from config.json the way a loader must, decodes with an
    independent bit-stream decoder and compares with the weights the reference ran on."""
    loaded = load_file(os.path.join(outdir, "model.safetensors"))
    with open(os.path.join(outdir, "config.json")) as f:
        qblock = json.load(f)["quantization"]
    seen = set()
    for key in sorted(loaded):
        if not key.endswith(".scales"):
            continue
        base = key[: -len(".scales")]
        override = qblock.get(base)
        assert override is not False, f"{base}: has scales but is marked float"
        bits = (override or qblock)["bits"]
        gs = (override or qblock)["group_size"]
        packed = loaded[base + ".weight"].numpy()
        scales = loaded[base + ".scales"].float().numpy()
        biases = loaded[base + ".biases"].float().numpy()
        assert packed.dtype == np.uint32
        assert packed.shape[-1] * 32 == scales.shape[-1] * gs * bits, f"{base}: packed width vs bits {bits} g{gs}"
        deq = mlx_affine.dequantize_slow(packed, scales, biases, bits, gs)
        assert np.array_equal(deq, dequantised[base]), f"{base}: decoded weights differ from the reference's"
        seen.add(base)
    assert seen == set(dequantised), f"quantized modules mismatch: {sorted(set(dequantised) ^ seen)}"


# --------------------------------------------------------------------------------------------------------------


def library_versions() -> dict:
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def make_fixture(fx: Fixture, root: str) -> dict:
    outdir = os.path.join(root, fx.name)
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)

    torch.manual_seed(fx.seed)  # module constructors draw random numbers; all are then overwritten
    model, text_model, lm_head, tcfg, mtp = build_model(fx)
    init_weights(fx, model, mtp, tcfg.hidden_size)

    dequantised = None
    if fx.layout == "mlx":
        ckpt, dequantised = mlx_convert(fx, model, mtp)
    else:
        ckpt = hf_checkpoint_tensors(fx, model, mtp)

    stats: dict = {}
    ref: dict[str, torch.Tensor] = {}
    prompts = []
    for length in PROMPT_LENGTHS:
        pname = f"p{len(prompts)}"
        prompts.append(pname)
        # Re-draw the prompt until no greedy / MTP-chain argmax is a near tie, so that an engine within tolerance
        # cannot legitimately pick a different token.
        for attempt in range(100):
            pstats: dict = {}
            res = run_prompt(fx, model, text_model, lm_head, mtp, prompt_ids(fx, length, attempt), pname, pstats)
            margin = min(pstats["greedy_min_top2_margin"][pname], pstats["mtp_chain_min_top2_margin"][pname])
            if margin >= MIN_ARGMAX_MARGIN and pstats["router_min_topk_gap"][pname] >= MIN_ROUTER_GAP:
                break
        else:
            raise RuntimeError(f"{fx.name}/{pname}: no prompt without a near-tie argmax")
        for key, value in pstats.items():
            if isinstance(value, dict):
                stats.setdefault(key, {}).update(value)
            else:
                stats[key] = max(stats.get(key, 0.0), value)
        stats.setdefault("prompt_attempt", {})[pname] = attempt
        ref.update(res)

    write_checkpoint_files(fx, outdir, ckpt)
    write_json(os.path.join(outdir, "config.json"), config_json(fx))
    write_json(
        os.path.join(outdir, "generation_config.json"),
        {"eos_token_id": fx.vocab - 1, "do_sample": False, "transformers_version": transformers.__version__},
    )
    write_safetensors(os.path.join(outdir, "reference.safetensors"), ref)

    reference = {
        "name": fx.name,
        "model_type": config_json(fx)["model_type"],
        "weights_dtype": fx.weights_dtype,
        "tolerance": fx.tolerance,
        "prompts": prompts,
        "prompt_lengths": list(PROMPT_LENGTHS),
        "greedy_tokens": GREEDY_TOKENS,
        "mtp_chain": MTP_CHAIN,
        "description": fx.description,
        "notes": [
            "Reference computed with transformers' own model classes on CPU in float32 "
            "(attn_implementation=eager, experts_implementation=eager), one thread, deterministic algorithms.",
            "greedy: 64 tokens from transformers' generate (cached prefill + 1-token cached decode), "
            "EOS ignored (eos_token_id=None, min_new_tokens=64); argmax ties go to the lowest id.",
            "MTP head: tools/reference/mtp_reference.py (spec section 8), reusing transformers' decoder layer.",
        ],
        "generator": {**library_versions(), "seed": fx.seed, "script": "tools/reference/make_fixtures.py"},
        "self_checks": stats,
    }
    if fx.weights_dtype == "bfloat16":
        reference["notes"].append(
            "Weights are stored in bfloat16 (A_log in float32); the reference runs in float32 on the "
            "bfloat16-rounded weights, not in bfloat16 arithmetic."
        )
    if fx.weights_dtype == "mlx-affine":
        reference["notes"].append(
            "The reference runs on the dequantised weights w = float32(scale) * q + float32(bias) "
            "(scales/biases stored in bfloat16; the product and sum are exact or float32-rounded), the stored "
            "bfloat16 float tensors upcast to float32, and norms as stored (1 + w folded in, rounded to bfloat16)."
        )
    write_json(os.path.join(outdir, "reference.json"), reference)

    # Verify the written files.
    p_last = ref[f"{prompts[-1]}.input_ids"].to(torch.int64)
    if fx.layout == "mlx":
        check_mlx_roundtrip(fx, outdir, dequantised)
    else:
        check_hf_roundtrip(fx, outdir, p_last, ref[f"{prompts[-1]}.logits"])
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "..", "tests", "fixtures")))
    ap.add_argument("--only", nargs="*", default=None, help="fixture names to (re)generate")
    args = ap.parse_args()
    names = {f.name for f in FIXTURES}
    for n in args.only or []:
        if n not in names:
            ap.error(f"unknown fixture {n!r}; known: {sorted(names)}")
    for fx in FIXTURES:
        if args.only and fx.name not in args.only:
            continue
        stats = make_fixture(fx, args.out)
        print(f"{fx.name}: ok {json.dumps(stats)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
