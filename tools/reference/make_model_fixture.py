#!/usr/bin/env python3
"""Generates a golden fixture (tests/fixtures/FORMAT.md) for an EXISTING checkpoint directory, by default the bundled
tiny coder (models/tiny-coder -> tests/fixtures/tiny-coder).

Unlike make_fixtures.py, nothing is random here: the weights are the trained checkpoint and the prompts are real
text tokenized with the model's own tokenizer. The checkpoint files in the fixture are relative symlinks to the
model directory, so the weights are committed once.

The reference is computed exactly like make_fixtures.py's (it reuses its run_prompt): transformers' own
Qwen3_5MoeForCausalLM on the CPU in float32, eager attention and experts, one thread, deterministic algorithms; the
stored bfloat16 weights are upcast to float32, which is exact. The MTP head is tools/reference/mtp_reference.py,
cross-checked here against the training code's MTP module (tools/train/model_def.py).

The vocabulary is 8192, so full-row logits of a ~100-token prompt would be 3.3 MB per tensor. The long prompt
therefore stores only some rows of its row-indexed tensors, listed in `<p>.rows` (FORMAT.md).

Usage: make_model_fixture.py [--model DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

# Importing make_fixtures also fixes the determinism settings (one thread, deterministic kernels, no mkldnn).
import make_fixtures as mf  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer, Qwen3_5MoeForCausalLM  # noqa: E402

from mtp_reference import MtpHead  # noqa: E402

TOLERANCE = 1e-4
# Files of the model directory that the fixture links to (the checkpoint as a user has it, plus the tokenizer).
LINKED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# The MTP reference (eager attention, KV cache) against the training code's batched MTP (sdpa, no cache), both
# float32 on the CPU: they differ only by summation order.
TRAIN_MTP_TOL = 1e-5
# Smallest allowed k-th/(k+1)-th router logit gap. The random fixtures use 5e-4, but a trained 16-expert top-4 router
# has many close calls (over the 600 to 1500 decisions of one prompt the smallest gap was 4e-5 to 5e-4). Two legitimate
# float32 implementations (transformers' cached and uncached paths) differ by up to ~1e-5 in the router logits (measured
# on every run, self_checks.router_logits_cached_vs_uncached_max_abs); this bound keeps a factor >= 10 over that.
MIN_ROUTER_GAP = 1e-4
ROUTER_NOISE_FACTOR = 10.0

# Original text written for this fixture (not taken from the training data).
MODULE_SNIPPET = '''class TextBuffer:
    def __init__(self, path):
        self.path = path
        self.lines = []

    def add(self, line):
        self.lines.append(line.rstrip("\\n"))

    def save(self):
        with open(self.path, "w") as f:
            f.write("\\n".join(self.lines))
'''


# Candidate prompts per slot, tried in order; the first whose reference has no near tie is used (the random
# fixtures re-draw their prompts for the same reason). Original text, not taken from the training data.
SHORT_CODE = ["def", "import", "class", "from", "return"]
LINE_CODE = [
    "def reverse_string(s):\n    return",
    "with open(path) as f:\n",
    "for line in lines:\n   ",
    "import os\nimport sys\n",
    "class Stack:\n    def",
]
CHAT_REQUESTS = [
    "Write a function that reverses a string. Add it to this module:",
    "Write a function that counts the words in a string. Add it to this module:",
    "Write a function that removes duplicate lines. Add it to this module:",
    "Add a method that returns the number of lines. Here is the class:",
    "Write a function that joins a list of words with commas. Add it to this module:",
    "Write a function that checks whether a file exists. Add it to this module:",
]


def prompt_candidates(tok) -> list[tuple[str, list[str]]]:
    """(kind, candidate texts) for p0, p1, p2: 1 token of code, ~7 tokens of code, a chat request of >= 100 tokens
    rendered with the model's chat template (thinking closed, generation prompt open)."""
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"{req}\n```python\n{MODULE_SNIPPET}```"}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        for req in CHAT_REQUESTS
    ]
    return [("code", SHORT_CODE), ("code", LINE_CODE), ("chat", chats)]


def stored_rows(T: int) -> list[int] | None:
    """Rows kept for a prompt: all of a short prompt; for a long one the first two, one in the middle and the last
    three (the last rows depend on every earlier token through the GDN state and the attention)."""
    if T <= 16:
        return None
    return sorted({0, 1, T // 2, T - 3, T - 2, T - 1})


ROW_KEYS = ("final_hidden", "logits", "mtp.logits", "mtp.hidden")


def keep_rows(res: dict, pname: str, rows: list[int], layers: int) -> None:
    idx = torch.tensor(rows, dtype=torch.int64)
    for key in [f"hidden.{i}" for i in range(layers)] + list(ROW_KEYS):
        full = f"{pname}.{key}"
        res[full] = res[full].index_select(0, idx).contiguous()
    res[f"{pname}.rows"] = idx.to(torch.int32)


class RouterTrace:
    """Records the trunk's router logits during mf.run_prompt, which runs (in this order) an uncached forward over
    the prompt, generate's cached prefill and 1-token decode steps, and an uncached forward over prompt + greedy[:-1].
    The last two cover the same rows, so their difference measures float32 noise between two legitimate paths."""

    def __init__(self, model):
        self.routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self.hooks = []

    def __enter__(self):
        for i, r in enumerate(self.routers):
            self.hooks.append(r.register_forward_hook(lambda m, a, o, i=i: self.calls[i].append(o[0].detach().clone())))
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()

    def cached_vs_uncached(self, T: int, new_tokens: int) -> float:
        rows = T + new_tokens - 1
        worst = 0.0
        for calls in self.calls:
            cached, uncached = torch.cat(calls[1:-1]), calls[-1]
            if calls[0].shape[0] != T or cached.shape != uncached.shape or uncached.shape[0] != rows:
                raise RuntimeError(f"router calls {[c.shape[0] for c in calls]} do not follow run_prompt's order")
            worst = max(worst, float((cached - uncached).abs().max()))
        return worst


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@torch.no_grad()
def load_model(model_dir: str):
    model = Qwen3_5MoeForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    stored = load_file(os.path.join(model_dir, "model.safetensors"))
    # The in-memory weights must be exactly the stored ones upcast (no conversion beyond bf16 -> f32).
    params = model.state_dict()
    for name, t in stored.items():
        if name.startswith("mtp."):
            continue
        if name not in params:
            raise RuntimeError(f"{model_dir}: tensor {name} is not a parameter of {type(model).__name__}")
        if not torch.equal(params[name], t.float()):
            raise RuntimeError(f"{model_dir}: loaded {name} differs from the stored tensor")
    absent = [n for n in params if n not in stored and "rotary_emb" not in n]
    if absent:
        raise RuntimeError(f"{model_dir}: parameters not in model.safetensors (left at their init): {absent}")

    mtp = MtpHead("qwen3_5_moe", model.config)
    mtp.config._attn_implementation = "eager"
    mtp.config._experts_implementation = "eager"
    mtp_sd = {n[len("mtp.") :]: t.float() for n, t in stored.items() if n.startswith("mtp.")}
    missing, unexpected = mtp.load_state_dict(mtp_sd, strict=False)
    missing = [n for n in missing if not n.startswith("rotary_emb.")]
    if missing or unexpected:
        raise RuntimeError(f"{model_dir}: mtp.* tensors do not match the MTP head: missing {missing}, "
                           f"unexpected {unexpected}")
    return model, mtp.eval()


@torch.no_grad()
def train_mtp_logits(model, mtp_ref: MtpHead, ids: torch.Tensor, next_tokens: torch.Tensor,
                     final_hidden: torch.Tensor) -> torch.Tensor:
    """The MTP logits of the training code's module (tools/train/model_def.py: one batched causal pass through
    sdpa, no cache) with the same weights and inputs as the reference pass."""
    train_dir = os.path.join(REPO, "tools", "train")
    if train_dir not in sys.path:
        sys.path.insert(0, train_dir)
    import model_def

    head = model_def.MtpHead(model.config)
    head.config._attn_implementation = "sdpa"
    head.config._experts_implementation = "eager"
    missing, unexpected = head.load_state_dict(
        {k: v for k, v in mtp_ref.state_dict().items() if not k.startswith("rotary_emb.")}, strict=True
    )
    assert not missing and not unexpected
    head.eval()
    T = ids.numel()
    positions = torch.arange(T).view(1, 1, -1).expand(3, 1, -1)
    cos, sin = model.model.rotary_emb(final_hidden[None], positions)
    out = head(model.model.embed_tokens(next_tokens)[None], final_hidden[None], (cos, sin))
    return model.lm_head(out)[0]


def link_checkpoint(model_dir: str, outdir: str) -> None:
    for fname in LINKED_FILES:
        target = os.path.join(model_dir, fname)
        if not os.path.isfile(target):
            raise RuntimeError(f"{model_dir}: missing {fname}")
        os.symlink(os.path.relpath(target, outdir), os.path.join(outdir, fname))


def make(model_dir: str, outdir: str) -> dict:
    model_dir = os.path.abspath(model_dir)
    outdir = os.path.abspath(outdir)
    name = os.path.basename(outdir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model, mtp = load_model(model_dir)
    cfg = model.config
    layers = cfg.num_hidden_layers

    fx = types.SimpleNamespace(name=name)  # run_prompt only uses the name, in messages
    stats: dict = {}
    ref: dict[str, torch.Tensor] = {}
    prompts, lengths, texts = [], [], []
    train_mtp_err = 0.0
    for kind, candidates in prompt_candidates(tok):
        pname = f"p{len(prompts)}"
        tried = []
        for attempt, text in enumerate(candidates):
            ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
            if tok.decode(ids.tolist()) != text:
                raise RuntimeError(f"{name}/{pname}: the tokenizer does not round-trip {text!r}")
            pstats: dict = {}
            with RouterTrace(model) as trace:
                res = mf.run_prompt(fx, model, model.model, model.lm_head, mtp, ids, pname, pstats)
            noise = trace.cached_vs_uncached(ids.numel(), mf.GREEDY_TOKENS)
            margins = (
                pstats["greedy_min_top2_margin"][pname],
                pstats["mtp_chain_min_top2_margin"][pname],
                pstats["router_min_topk_gap"][pname],
            )
            tried.append(margins)
            # Same bounds as the random fixtures: within tolerance an engine cannot pick another token or expert.
            if noise * ROUTER_NOISE_FACTOR > MIN_ROUTER_GAP:
                raise RuntimeError(f"{name}/{pname}: router logits of the cached and uncached paths differ by "
                                   f"{noise}; MIN_ROUTER_GAP {MIN_ROUTER_GAP} no longer has a margin over that")
            if min(margins[:2]) >= mf.MIN_ARGMAX_MARGIN and margins[2] >= MIN_ROUTER_GAP:
                break
        else:
            raise RuntimeError(
                f"{name}/{pname}: every candidate prompt has a near tie (greedy margin, chain margin, router "
                f"gap): {tried}; add candidates"
            )

        # The reference MTP head against the training code's MTP on the same rows (all T rows: row T-1 feeds
        # greedy[0]).
        greedy = res[f"{pname}.greedy"].to(torch.int64)
        next_tokens = torch.cat([ids[1:], greedy[:1]])
        train_logits = train_mtp_logits(model, mtp, ids, next_tokens, res[f"{pname}.final_hidden"])
        err = mf.rel_err(train_logits, res[f"{pname}.mtp.logits"])
        if err > TRAIN_MTP_TOL:
            raise RuntimeError(f"{name}/{pname}: MTP reference vs tools/train MTP rel err {err}")
        train_mtp_err = max(train_mtp_err, err)
        stats.setdefault("train_mtp_max_abs_diff", {})[pname] = float(
            (train_logits - res[f"{pname}.mtp.logits"]).abs().max()
        )

        T = ids.numel()
        rows = stored_rows(T)
        if rows is not None:
            keep_rows(res, pname, rows, layers)
        for key, value in pstats.items():
            if isinstance(value, dict):
                stats.setdefault(key, {}).update(value)
            else:
                stats[key] = max(stats.get(key, 0.0), value)
        stats.setdefault("prompt_attempt", {})[pname] = attempt
        stats["router_logits_cached_vs_uncached_max_abs"] = max(
            stats.get("router_logits_cached_vs_uncached_max_abs", 0.0), noise
        )
        ref.update(res)
        prompts.append(pname)
        lengths.append(T)
        texts.append({"kind": kind, "text": text})
    stats["train_mtp_rel_err"] = train_mtp_err

    if os.path.lexists(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    link_checkpoint(model_dir, outdir)
    mf.write_safetensors(os.path.join(outdir, "reference.safetensors"), ref)
    rel_model = os.path.relpath(model_dir, REPO)
    reference = {
        "name": name,
        "model_type": cfg.model_type,
        "weights_dtype": "bfloat16",
        "tolerance": TOLERANCE,
        "prompts": prompts,
        "prompt_lengths": lengths,
        "prompt_texts": texts,
        "greedy_tokens": mf.GREEDY_TOKENS,
        "mtp_chain": mf.MTP_CHAIN,
        "description": f"the bundled trained model {rel_model} (qwen3_5_moe_text, bf16 weights, A_log float32, "
        "fused experts, MTP head); checkpoint and tokenizer files are symlinks to the model directory; prompts "
        "are real text tokenized with its tokenizer",
        "notes": [
            "Reference computed with transformers' Qwen3_5MoeForCausalLM.from_pretrained(dtype=float32, "
            "attn_implementation=eager, experts_implementation=eager) on CPU, one thread, deterministic "
            "algorithms: float32 arithmetic on the stored bfloat16 weights (upcast exactly), not bf16 arithmetic.",
            "greedy: 64 tokens from transformers' generate (cached prefill + 1-token cached decode), "
            "EOS ignored (eos_token_id=None, min_new_tokens=64); argmax ties go to the lowest id.",
            "MTP head: tools/reference/mtp_reference.py (spec section 8), reusing transformers' decoder layer; "
            "cross-checked against tools/train/model_def.py's MTP (self_checks.train_mtp_rel_err).",
            "Prompts with more than 16 tokens store only the rows listed in <p>.rows of hidden.<l>, final_hidden, "
            "logits, mtp.logits and mtp.hidden (FORMAT.md).",
            "tolerance 1e-4 as for the float32 fixtures: the reference is float32 math on exactly representable "
            "weights, so a float32 engine is held to the same bound (the bf16 random fixture's 2e-2 is not needed).",
        ],
        "checkpoint_sha256": {f: sha256_file(os.path.join(model_dir, f)) for f in LINKED_FILES},
        "generator": {
            **mf.library_versions(),
            "seed": None,
            "script": "tools/reference/make_model_fixture.py",
            "model": rel_model,
        },
        "self_checks": stats,
    }
    mf.write_json(os.path.join(outdir, "reference.json"), reference)

    # The fixture directory, as the engine will open it (through the symlinks), must load in transformers and give
    # the same logits on the last prompt's stored rows.
    reloaded = Qwen3_5MoeForCausalLM.from_pretrained(
        outdir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    last = prompts[-1]
    with torch.no_grad():
        logits = reloaded(input_ids=ref[f"{last}.input_ids"].to(torch.int64)[None], use_cache=False).logits[0]
    rows = ref.get(f"{last}.rows")
    if rows is not None:
        logits = logits.index_select(0, rows.to(torch.int64))
    if not torch.equal(logits, ref[f"{last}.logits"]):
        raise RuntimeError(f"{name}: the fixture directory reloaded by transformers gives different logits")
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(REPO, "models", "tiny-coder"))
    ap.add_argument("--out", default=None, help="fixture directory (default tests/fixtures/<model dir name>)")
    args = ap.parse_args()
    out = args.out or os.path.join(REPO, "tests", "fixtures", os.path.basename(os.path.normpath(args.model)))
    stats = make(args.model, out)
    print(f"{os.path.basename(out)}: ok {mf.json.dumps(stats)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
