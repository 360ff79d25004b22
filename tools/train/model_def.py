"""The tiny coder: transformers' own qwen3_5_moe text model plus one MTP layer, and its joint training forward.

The trunk is `Qwen3_5MoeForCausalLM` (model_type "qwen3_5_moe_text"), unchanged. The MTP head follows spec §8 and
has the module tree of `tools/reference/mtp_reference.py` (fc, pre_fc_norm_embedding, pre_fc_norm_hidden,
layers.0 = transformers' decoder layer built as full attention + MoE, norm), so its state_dict names are the
checkpoint's `mtp.*` names. What is new here is a batched, cache-free forward over whole training sequences.

Two training-only speedups leave the math unchanged:
  * `dense_train` experts: every expert runs on every token and the unselected ones get weight 0, which equals the
    routed sum (top-k weights renormalised exactly as the router does); it replaces a Python loop over experts by
    two batched matmuls.
  * the chunked gated-delta rule runs with autocast off, i.e. in fp32 as transformers intends, instead of letting
    autocast push its fp32 matmuls down to bf16.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3_5MoeTextConfig
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as qmod

# ---------------------------------------------------------------------------------------------------------------
# Architecture


def make_config(vocab_size: int, ids: dict[str, int], max_positions: int) -> Qwen3_5MoeTextConfig:
    """Real Qwen3.5 proportions scaled down: 3 GDN : 1 attention, GQA, gated attention, partial RoPE 0.25,
    GDN with twice as many value heads as key heads, routed top-k experts plus a gated shared expert."""
    layers = 8
    return Qwen3_5MoeTextConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        max_position_embeddings=max_positions,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            # 16 rotary dims = 8 frequencies; the sections only matter for images (text positions are equal).
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        attention_bias=False,
        tie_word_embeddings=False,
        initializer_range=0.02,
        router_aux_loss_coef=0.001,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        # Fields of the published Qwen3.5 text config that transformers does not use but engines read.
        attn_output_gate=True,
        mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False,
        mamba_ssm_dtype="float32",
        full_attention_interval=4,
    )


class MtpHead(nn.Module):
    """One MTP layer (spec §8.1). Same submodules and names as tools/reference/mtp_reference.MtpHead."""

    def __init__(self, text_config: Qwen3_5MoeTextConfig):
        super().__init__()
        cfg = copy.deepcopy(text_config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        self.config = cfg
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = qmod.Qwen3_5MoeRMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = qmod.Qwen3_5MoeRMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList([qmod.Qwen3_5MoeDecoderLayer(cfg, 0)])
        self.norm = qmod.Qwen3_5MoeRMSNorm(hidden, eps=eps)

    def forward(self, token_embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """token_embeds = embed(x_{t+1}), hidden = trunk final-norm h_t, both [B, T, H]; rope at position t.
        Causal attention over the T rows (the head's own KV history). Returns post-`norm` states [B, T, H]."""
        e = self.pre_fc_norm_embedding(token_embeds)
        s = self.pre_fc_norm_hidden(hidden)
        u = self.fc(torch.cat([e, s], dim=-1))
        # attention_mask=None: sdpa uses is_causal; eager would need an explicit mask, so sdpa is required here.
        u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(u)


def init_mtp(mtp: MtpHead, lm: qmod.Qwen3_5MoeForCausalLM) -> None:
    """The trunk's own initialisation rules (normal(0, initializer_range) linears/experts/router, zero norms)."""
    for module in mtp.modules():
        lm._init_weights(module)


# ---------------------------------------------------------------------------------------------------------------
# Training-only fast paths (same math)


def dense_train_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    num_tokens, hidden = hidden_states.shape
    experts, inter = self.num_experts, self.intermediate_dim
    weights = torch.zeros(num_tokens, experts, dtype=top_k_weights.dtype, device=hidden_states.device)
    weights.scatter_(1, top_k_index, top_k_weights)
    # gate_up_proj [E, 2I, H] as one [E*2I, H] linear; per expert the first I outputs are gate, the next I up.
    gate_up = F.linear(hidden_states, self.gate_up_proj.reshape(experts * 2 * inter, hidden))
    gate, up = gate_up.view(num_tokens, experts, 2 * inter).chunk(2, dim=-1)
    act = self.act_fn(gate) * up * weights.unsqueeze(-1).to(gate_up.dtype)
    # down_proj [E, H, I] as one [H, E*I] linear over the weighted activations of all experts.
    down = self.down_proj.permute(1, 0, 2).reshape(hidden, experts * inter)
    out = F.linear(act.reshape(num_tokens, experts * inter), down)
    return out.to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register("dense_train", dense_train_experts_forward)

_chunk_rule = qmod.torch_chunk_gated_delta_rule


def _chunk_rule_fp32(query, *args, **kwargs):
    with torch.autocast(device_type=query.device.type, enabled=False):
        return _chunk_rule(query, *args, **kwargs)


def use_fast_training_paths(lm: qmod.Qwen3_5MoeForCausalLM, mtp: MtpHead, experts: str) -> None:
    for cfg in (lm.config, mtp.config):
        cfg._experts_implementation = experts
    # The decoder layers look the function up in the module's globals at call time.
    qmod.torch_chunk_gated_delta_rule = _chunk_rule_fp32


def use_reference_paths(lm: qmod.Qwen3_5MoeForCausalLM, mtp: MtpHead) -> None:
    for cfg in (lm.config, mtp.config):
        cfg._experts_implementation = "eager"
    qmod.torch_chunk_gated_delta_rule = _chunk_rule


# ---------------------------------------------------------------------------------------------------------------
# Joint forward


class RouterTap:
    """Collects router logits of every MoE block (trunk and MTP) for the load-balancing loss."""

    def __init__(self, modules):
        self.logits: list[torch.Tensor] = []
        self.handles = [m.register_forward_hook(self._hook) for m in modules]

    def _hook(self, module, args, output):
        self.logits.append(output[0])


def load_balance_loss(router_logits: list[torch.Tensor], top_k: int) -> torch.Tensor:
    """Switch-style: E * sum_e (fraction of top-k slots routed to e) * (mean router probability of e), per layer."""
    total = 0.0
    for logits in router_logits:
        probs = logits.float().softmax(dim=-1)
        num_experts = probs.shape[-1]
        chosen = probs.topk(top_k, dim=-1).indices
        frac = F.one_hot(chosen, num_experts).float().sum(dim=1).mean(dim=0) / top_k
        total = total + num_experts * (frac * probs.mean(dim=0)).sum()
    return total / max(1, len(router_logits))


def joint_forward(lm, mtp, ids: torch.Tensor, want_logits: bool = False) -> dict:
    """ids [B, L+1]. Trunk predicts x_{t+1} at t = 0..L-1; MTP at t = 0..L-2 sees (embed(x_{t+1}), h_t), predicts
    x_{t+2}. Returns losses (mean CE) and, if asked, the logits for evaluation."""
    inp = ids[:, :-1]
    seq = inp.shape[1]
    out = lm.model(input_ids=inp, use_cache=False)
    hidden = out.last_hidden_state  # post final norm (Qwen3_5MoeTextModel applies self.norm before returning)
    logits = lm.lm_head(hidden)
    loss_main = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())

    positions = torch.arange(seq, device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)
    cos, sin = lm.model.rotary_emb(hidden, positions)
    emb_next = lm.model.embed_tokens(ids[:, 1:seq])
    mtp_out = mtp(emb_next, hidden[:, : seq - 1], (cos[:, : seq - 1], sin[:, : seq - 1]))
    mtp_logits = lm.lm_head(mtp_out)
    loss_mtp = F.cross_entropy(mtp_logits.float().flatten(0, 1), ids[:, 2:].flatten())
    result = {"loss_main": loss_main, "loss_mtp": loss_mtp}
    if want_logits:
        result["logits"] = logits
        result["mtp_logits"] = mtp_logits
    return result
