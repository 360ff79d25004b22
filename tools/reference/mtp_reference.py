"""Reference MTP (multi-token prediction) head for qwen3_5_moe / qwen3_next, written to spec §8.

transformers has no MTP module for these models (it drops `mtp.*` on load), so this is our own. To keep the math
identical to the main model, the one MTP layer is transformers' own decoder-layer class built as a full-attention
layer, and the norms are transformers' zero-centred RMSNorm class.

Per row (token x, hidden h, position p):
    e = pre_fc_norm_embedding(embed_tokens[x])        zero-centred RMSNorm
    s = pre_fc_norm_hidden(h)                         h = the main model's post-final-norm hidden
    u = fc(concat[e, s])                              embedding first, fc: [H, 2H], no bias
    u = decoder_layer(u, rope position p)             full attention + MoE, own KV cache
    out = norm(u)                                     zero-centred RMSNorm
    logits = lm_head(out)                             the main model's lm_head (shared)
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import DynamicCache


class MtpHead(nn.Module):
    """One-layer MTP head. `family` is "qwen3_5_moe" or "qwen3_next"; `text_config` is the main model's text config."""

    def __init__(self, family: str, text_config):
        super().__init__()
        if family == "qwen3_5_moe":
            from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mod

            layer_cls, norm_cls, rope_cls = (
                mod.Qwen3_5MoeDecoderLayer,
                mod.Qwen3_5MoeRMSNorm,
                mod.Qwen3_5MoeTextRotaryEmbedding,
            )
        elif family == "qwen3_next":
            from transformers.models.qwen3_next import modeling_qwen3_next as mod

            layer_cls, norm_cls, rope_cls = (
                mod.Qwen3NextDecoderLayer,
                mod.Qwen3NextRMSNorm,
                mod.Qwen3NextRotaryEmbedding,
            )
        else:
            raise ValueError(f"unknown family {family!r}")
        self.family = family

        # The MTP layer is layer 0 of a one-layer, all-attention copy of the text config; the copy also gives the
        # layer its own KV cache (a separate DynamicCache with one full-attention layer).
        cfg = copy.deepcopy(text_config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        if family == "qwen3_next":
            cfg.mlp_only_layers = []
            cfg.decoder_sparse_step = 1
        self.config = cfg

        hidden = cfg.hidden_size
        eps = cfg.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = norm_cls(hidden, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(hidden, eps=eps)
        self.layers = nn.ModuleList([layer_cls(cfg, 0)])
        self.norm = norm_cls(hidden, eps=eps)
        self.rotary_emb = rope_cls(config=cfg)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor):
        pos = positions.view(1, -1)
        if self.family == "qwen3_5_moe":
            # Text-only: the T/H/W MRoPE rows are all equal to the position (plain 1-D RoPE).
            pos = pos.unsqueeze(0).expand(3, 1, -1)
        return self.rotary_emb(x, pos)

    def forward(
        self,
        token_embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        lm_head: nn.Module,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """token_embeds, hidden: [T, H]; positions: [T] (consecutive, continuing the cache).

        Returns (logits [T, V], post-`norm` hidden [T, H]). Appends T entries to `cache`.
        """
        n = token_embeds.shape[0]
        past = cache.get_seq_length()
        if positions.numel() != n:
            raise ValueError("one position per row")
        e = self.pre_fc_norm_embedding(token_embeds)
        s = self.pre_fc_norm_hidden(hidden)
        u = self.fc(torch.cat([e, s], dim=-1)).unsqueeze(0)  # [1, T, H]
        cos_sin = self._rope(u, positions)

        # Additive causal mask over [past entries | these rows]; the eager attention adds it to the scores.
        total = past + n
        q_idx = torch.arange(n).view(n, 1) + past
        k_idx = torch.arange(total).view(1, total)
        mask = torch.zeros(n, total, dtype=u.dtype)
        mask.masked_fill_(k_idx > q_idx, torch.finfo(u.dtype).min)
        mask = mask.view(1, 1, n, total)

        u = self.layers[0](
            u,
            position_embeddings=cos_sin,
            attention_mask=mask,
            position_ids=positions.view(1, -1),
            past_key_values=cache,
            use_cache=True,
        )
        out = self.norm(u)[0]
        return lm_head(out), out


def mtp_state_dict_names(family: str, num_experts: int, per_expert: bool, mtp: MtpHead) -> dict[str, torch.Tensor]:
    """The head's tensors under checkpoint names (`mtp.*`), experts fused or split per expert."""
    out: dict[str, torch.Tensor] = {}
    for name, t in mtp.state_dict().items():
        if name.startswith("rotary_emb."):
            continue
        full = "mtp." + name
        if per_expert and name.endswith("mlp.experts.gate_up_proj"):
            base = full[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(num_experts):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif per_expert and name.endswith("mlp.experts.down_proj"):
            base = full[: -len("down_proj")]
            for e in range(num_experts):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[full] = t
    return out
