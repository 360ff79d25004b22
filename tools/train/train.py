"""Train the bundled tiny coder end to end: data -> tokenizer -> qwen3_5_moe_text + MTP -> eval -> HF checkpoint.

    python tools/train/train.py --out OUT_DIR [--work-dir DIR] [--time-budget 380] [--deadline 540] ...
    (tools/train/train.sh wraps the GPU run and the CPU smoke test.)

Writes the finished model directory to WORK_DIR/model, then packs it for transfer into OUT_DIR:
tiny-coder.tar.part-NN (the tar split in 15 MiB pieces), train_log.json and loss.png.
`tools/train/write_card.py` unpacks that into models/tiny-coder/ and fills the model card.

Time: the training loop stops at --time-budget seconds, and earlier if the whole process would pass --deadline
seconds (measured from start) with the post-training work still to do. With --steps 0 the step count is chosen
after a few probe steps from the measured step time and capped by --max-epochs; the schedule (warmup + cosine)
is fixed from then on. The held-out loss is measured periodically and the best weights are kept.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import math
import os
import platform
import random
import sys
import tarfile
import time

T_START = time.time()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import data as data_mod  # noqa: E402
import model_def as md  # noqa: E402
import tokenizer_build as tb  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM  # noqa: E402
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

PART_BYTES = 15 * 1024 * 1024
LOG_FILE = None
# PreTrainedConfig fields that say nothing about this model.
GENERIC_CONFIG_KEYS = [
    "id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder", "output_attentions",
    "output_hidden_states", "problem_type", "return_dict", "output_router_logits", "use_cache",
]


def log(msg: str) -> None:
    line = f"[{time.time() - T_START:7.1f}s] {msg}"
    print(line, flush=True)
    if LOG_FILE:
        with open(LOG_FILE, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def guarded(what: str, errors: list, fn, *args, **kwargs):
    """Runs one post-training stage; a failure is logged and recorded so the trained weights still ship."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        import traceback

        log(f"ERROR in {what}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the packed results (the device's $OUT)")
    p.add_argument("--work-dir", default=os.path.join(REPO, "build", "train"), help="scratch + model directory")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--cpu-threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    # data
    p.add_argument("--max-files", type=int, default=0, help="use only the first N files (smoke tests)")
    p.add_argument("--no-tests", action="store_true", help="skip the stdlib test/tests/idle_test folders")
    p.add_argument("--held-out-per-mille", type=int, default=20)
    p.add_argument("--chat-keep", type=float, default=0.5, help="fraction of documented functions made into chats")
    p.add_argument("--tool-convs", type=int, default=300)
    p.add_argument("--vocab-size", type=int, default=8192)
    # training
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--aux-weight", type=float, default=0.01, help="router load-balancing loss weight")
    p.add_argument("--steps", type=int, default=0, help="fixed step count (0 = choose from time and epochs)")
    p.add_argument("--max-epochs", type=float, default=8.0)
    p.add_argument("--probe-steps", type=int, default=12)
    p.add_argument("--time-budget", type=float, default=380.0, help="seconds for the training loop")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds since start the whole run must end by")
    p.add_argument("--post-reserve", type=float, default=75.0, help="seconds kept for eval/save after training")
    p.add_argument("--evals", type=int, default=16, help="periodic held-out evaluations during training")
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows per periodic evaluation")
    p.add_argument("--experts", default="dense_train", help="experts implementation for training")
    # final evaluation
    p.add_argument("--final-eval-windows", type=int, default=0, help="0 = every held-out window")
    p.add_argument("--gen-prompts", type=int, default=16)
    p.add_argument("--gen-prompt-len", type=int, default=64)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--chat-tokens", type=int, default=160, help="greedy tokens for the chat sample in the card")
    return p.parse_args(argv)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


# ---------------------------------------------------------------------------------------------------------------
# Data


def build_data(args, work: str, template: str) -> dict:
    corpus = data_mod.collect_stdlib(
        include_tests=not args.no_tests, held_out_per_mille=args.held_out_per_mille, max_files=args.max_files
    )
    log(f"stdlib {corpus.root} (Python {corpus.python_version}): {corpus.stats}")
    if not any(f.held_out for f in corpus.files) or all(f.held_out for f in corpus.files):
        raise SystemExit("the held-out split is empty or everything; change --held-out-per-mille / --max-files")
    train_convs, held_convs = data_mod.build_conversations(corpus, args.seed, args.chat_keep, args.tool_convs)

    def render(conv):
        text = render_jinja_template(
            conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=template
        )[0][0]
        return text

    train_chat = [render(c) for c in train_convs]
    held_chat = [render(c) for c in held_convs]
    train_code = [f.text for f in corpus.files if not f.held_out]
    held_code = [f.text for f in corpus.files if f.held_out]
    log(f"conversations: {len(train_chat)} train ({sum(len(c) for c in train_chat)} chars), {len(held_chat)} held out")

    t0 = time.time()
    tok = tb.build_tokenizer(train_code + train_chat, args.vocab_size)
    tok_seconds = time.time() - t0
    log(f"tokenizer: {tok.get_vocab_size()} tokens, trained in {tok_seconds:.1f}s")
    ids = tb.token_ids(tok)
    eot = ids["<|endoftext|>"]

    def stream(texts, shuffle_seed=None):
        order = list(range(len(texts)))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(order)
        enc = tok.encode_batch([texts[i] for i in order], add_special_tokens=False)
        parts = []
        for e in enc:
            parts.append(np.asarray(e.ids, dtype=np.int32))
            parts.append(np.asarray([eot], dtype=np.int32))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    t0 = time.time()
    kinds = ["code"] * len(train_code) + ["chat"] * len(train_chat)
    train_stream = stream(train_code + train_chat, shuffle_seed=args.seed)
    held_code_stream = stream(held_code)
    held_chat_stream = stream(held_chat) if held_chat else np.zeros(0, dtype=np.int32)
    enc_seconds = time.time() - t0
    stats = {
        "source": "python-stdlib",
        "license": data_mod.LICENSE_NOTE,
        "python_version": corpus.python_version,
        "stdlib_root": corpus.root,
        "files": corpus.stats,
        "train_documents": {"code": kinds.count("code"), "chat": kinds.count("chat")},
        "held_out_chat_documents": len(held_chat),
        "tokens": {
            "train": int(train_stream.size),
            "held_out_code": int(held_code_stream.size),
            "held_out_chat": int(held_chat_stream.size),
        },
        "train_bytes_per_token": round(
            sum(len(t.encode()) for t in train_code + train_chat) / max(1, train_stream.size), 3
        ),
        "held_out_files": [f.relpath for f in corpus.files if f.held_out],
        "tokenizer_train_seconds": round(tok_seconds, 2),
        "encode_seconds": round(enc_seconds, 2),
    }
    log(f"tokens: {stats['tokens']}")
    manifest = [{"path": f.relpath, "sha256": f.sha256, "held_out": f.held_out} for f in corpus.files]
    with open(os.path.join(work, "data_manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return {
        "tok": tok,
        "ids": ids,
        "train": train_stream,
        "held_code": held_code_stream,
        "held_chat": held_chat_stream,
        "stats": stats,
        "sample_conv": train_convs[-1] if train_convs else None,
        "check_texts": held_code[:4] + held_chat[:4],
    }


def windows(stream: np.ndarray, length: int, limit: int) -> torch.Tensor:
    """Non-overlapping windows of `length` tokens (the last partial one dropped), evenly thinned to `limit`."""
    n = stream.size // length
    if n == 0:
        return torch.zeros(0, length, dtype=torch.long)
    w = torch.from_numpy(stream[: n * length].astype(np.int64)).view(n, length)
    if limit and n > limit:
        w = w[torch.linspace(0, n - 1, limit).round().long()]
    return w


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(lm, mtp, wins: torch.Tensor, device, batch: int, autocast: bool) -> dict:
    lm.eval()
    mtp.eval()
    tot = {"n_main": 0, "n_mtp": 0, "loss_main": 0.0, "loss_mtp": 0.0, "top1_main": 0, "top1_mtp": 0, "agree": 0}
    for i in range(0, wins.shape[0], batch):
        ids = wins[i : i + batch].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            r = md.joint_forward(lm, mtp, ids, want_logits=True)
        logits, mlogits = r["logits"].float(), r["mtp_logits"].float()
        tgt1, tgt2 = ids[:, 1:], ids[:, 2:]
        tot["loss_main"] += F.cross_entropy(logits.flatten(0, 1), tgt1.flatten(), reduction="sum").item()
        tot["loss_mtp"] += F.cross_entropy(mlogits.flatten(0, 1), tgt2.flatten(), reduction="sum").item()
        am, amtp = logits.argmax(-1), mlogits.argmax(-1)
        tot["top1_main"] += (am == tgt1).sum().item()
        tot["top1_mtp"] += (amtp == tgt2).sum().item()
        # Draft at t (fed the true x_{t+1}) vs the trunk's own greedy choice at t+1 (what greedy verify accepts).
        tot["agree"] += (amtp == am[:, 1:]).sum().item()
        tot["n_main"] += tgt1.numel()
        tot["n_mtp"] += tgt2.numel()
    lm.train()
    mtp.train()
    nm, nt = max(1, tot["n_main"]), max(1, tot["n_mtp"])
    return {
        "loss_main": tot["loss_main"] / nm,
        "loss_mtp": tot["loss_mtp"] / nt,
        "top1_main": tot["top1_main"] / nm,
        "top1_mtp": tot["top1_mtp"] / nt,
        "mtp_agrees_with_trunk_greedy": tot["agree"] / nt,
        "tokens": tot["n_main"],
    }


@torch.no_grad()
def greedy_generate(lm, prompts: torch.Tensor, new_tokens: int, stop_id: int | None = None) -> torch.Tensor:
    """Greedy continuation by full recomputation (no cache), so it uses exactly the evaluated forward path.
    With stop_id, stops once every row has produced it."""
    seq = prompts
    done = torch.zeros(prompts.shape[0], dtype=torch.bool, device=prompts.device)
    for _ in range(new_tokens):
        logits = lm.lm_head(lm.model(input_ids=seq, use_cache=False).last_hidden_state[:, -1])
        nxt = logits.argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
        if stop_id is not None:
            done |= nxt[:, 0] == stop_id
            if bool(done.all()):
                break
    return seq


@torch.no_grad()
def greedy_acceptance(lm, mtp, held: np.ndarray, args, device) -> dict:
    """k=1 greedy acceptance on the trunk's own greedy text: at each generated position t the draft
    MTP(embed(y_{t+1}), h_t) is accepted iff it equals y_{t+2}, the trunk's greedy token."""
    p_len, g = args.gen_prompt_len, args.gen_tokens
    prompts = windows(held, p_len, args.gen_prompts)
    if prompts.shape[0] == 0 or g < 3:
        return {}
    lm.eval()
    mtp.eval()
    seq = greedy_generate(lm, prompts.to(device), g)
    ids = torch.cat([seq, seq[:, -1:]], dim=1)  # joint_forward wants L+1 tokens; the extra one is never scored
    r = md.joint_forward(lm, mtp, ids, want_logits=True)
    draft = r["mtp_logits"].argmax(-1)  # draft[t] predicts ids[t+2]
    t0, t1 = p_len - 1, p_len + g - 2  # drafts whose targets are generated tokens y_{p+1} .. y_{p+g-1}
    hits = (draft[:, t0:t1] == seq[:, t0 + 2 : t1 + 2]).float()
    lm.train()
    mtp.train()
    return {
        "prompts": int(prompts.shape[0]),
        "prompt_tokens": p_len,
        "generated_tokens": g,
        "k1_acceptance": hits.mean().item(),
        "k1_tokens_per_cycle": 1.0 + hits.mean().item(),
        "sequences": seq.cpu(),
    }


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint


def checkpoint_tensors(lm, mtp) -> dict[str, torch.Tensor]:
    """HF names: the trunk's state_dict (experts fused) plus mtp.*; bf16 except A_log (fp32, as MLX/vLLM keep it)."""
    tensors = {}
    for prefix, module in (("", lm), ("mtp.", mtp)):
        for name, t in module.state_dict().items():
            tensors[prefix + name] = t.detach().to("cpu")
    out = {}
    for name, t in sorted(tensors.items()):
        dtype = torch.float32 if name.endswith("A_log") else torch.bfloat16
        out[name] = t.to(dtype).contiguous().clone()
    return out


def round_to_checkpoint_dtypes(lm, mtp) -> None:
    """Make the in-memory fp32 weights exactly the values the checkpoint stores."""
    with torch.no_grad():
        for module in (lm, mtp):
            for name, p in module.named_parameters():
                if not name.endswith("A_log"):
                    p.copy_(p.to(torch.bfloat16).to(p.dtype))


def write_model_dir(model_dir: str, lm, mtp, tok, ids: dict, template: str, max_positions: int) -> dict:
    os.makedirs(model_dir, exist_ok=True)
    tensors = checkpoint_tensors(lm, mtp)
    save_file(tensors, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})

    config = lm.config.to_dict()
    for key in [k for k in config if k.startswith("_")] + GENERIC_CONFIG_KEYS:
        config.pop(key, None)
    config["architectures"] = ["Qwen3_5MoeForCausalLM"]
    config["dtype"] = "bfloat16"
    config["transformers_version"] = transformers.__version__
    with open(os.path.join(model_dir, "config.json"), "w") as fh:
        json.dump(dict(sorted(config.items())), fh, indent=2)
        fh.write("\n")

    gen = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(model_dir, "generation_config.json"), "w") as fh:
        json.dump(gen, fh, indent=2)
        fh.write("\n")
    tb.write_tokenizer_files(tok, model_dir, template, max_positions)
    return {name: list(t.shape) for name, t in tensors.items()}


@torch.no_grad()
def verify_model_dir(model_dir: str, lm, mtp, sample: torch.Tensor, template: str, conv: dict | None,
                     raw_tok, texts: list[str]) -> dict:
    """Reload with transformers; the reloaded trunk and a fresh MTP head loaded from mtp.* must reproduce the
    in-memory logits; the reference MTP module (tools/reference) must agree; the tokenizer must round-trip."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = {}
    md.use_reference_paths(lm, mtp)
    lm.eval()
    mtp.eval()
    loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, experts_implementation="eager")
    loaded = loaded.to(sample.device).eval()
    result["reload_class"] = type(loaded).__name__
    ids = sample[:1]
    ref = md.joint_forward(lm, mtp, ids, want_logits=True)
    logits_loaded = loaded.lm_head(loaded.model(input_ids=ids[:, :-1], use_cache=False).last_hidden_state)
    result["trunk_logits_max_abs_diff"] = (logits_loaded - ref["logits"]).abs().max().item()

    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    mtp_names = sorted(n for n in tensors if n.startswith("mtp."))
    result["mtp_tensor_count"] = len(mtp_names)
    fresh = md.MtpHead(loaded.config)
    fresh.config._attn_implementation = "sdpa"
    fresh.config._experts_implementation = "eager"
    missing, unexpected = fresh.load_state_dict({n[4:]: t.float() for n, t in tensors.items() if n[:4] == "mtp."})
    if missing or unexpected:
        raise RuntimeError(f"mtp.* tensors do not match the MTP head: missing {missing}, unexpected {unexpected}")
    fresh = fresh.to(sample.device).eval()
    rel = md.joint_forward(loaded, fresh, ids, want_logits=True)
    result["mtp_logits_max_abs_diff"] = (rel["mtp_logits"] - ref["mtp_logits"]).abs().max().item()

    # Cross-check against the project's reference MTP module (eager attention, incremental KV cache), on CPU
    # because that module builds its mask on the CPU.
    try:
        sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
        from mtp_reference import MtpHead as RefHead

        refhead = RefHead("qwen3_5_moe", loaded.config)
        refhead.config._attn_implementation = "eager"
        refhead.config._experts_implementation = "eager"
        refhead.load_state_dict({n[4:]: t.float() for n, t in tensors.items() if n[:4] == "mtp."}, strict=False)
        refhead.eval()
        x = ids[0]
        seq = x.shape[0] - 1
        h = loaded.model(input_ids=x[None, :-1], use_cache=False).last_hidden_state[0, : seq - 1].cpu()
        emb = loaded.model.embed_tokens(x[1:seq]).cpu()
        head = copy.deepcopy(loaded.lm_head).cpu()
        lg, _ = refhead(emb, h, torch.arange(seq - 1), refhead.new_cache(), head)
        result["reference_mtp_max_abs_diff"] = (lg - rel["mtp_logits"][0].cpu()).abs().max().item()
    except Exception as exc:  # the reference lives in another helper's folder; report, do not fail the run
        result["reference_mtp_error"] = f"{type(exc).__name__}: {exc}"

    tok = AutoTokenizer.from_pretrained(model_dir)
    result["tokenizer_class"] = type(tok).__name__
    text = "def add(a, b):\n    return a + b  # ünïcode\n"
    result["tokenizer_roundtrip"] = tok.decode(tok(text)["input_ids"]) == text
    # The saved tokenizer, as transformers loads it, must encode exactly like the one we trained.
    result["tokenizer_matches_trained"] = all(
        tok(t, add_special_tokens=False)["input_ids"] == raw_tok.encode(t, add_special_tokens=False).ids for t in texts
    )
    if conv is not None:
        mine = render_jinja_template(conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=template)[
            0
        ][0]
        theirs = tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False)
        result["chat_template_matches"] = mine == theirs
    result["generation_prompt"] = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    return result


# ---------------------------------------------------------------------------------------------------------------
# Main


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer:
    """The training loop: random windows of the token stream, joint loss, periodic held-out evaluation."""

    def __init__(self, args, lm, mtp, cfg, train_stream: np.ndarray, held_wins: torch.Tensor, device):
        self.args, self.lm, self.mtp, self.cfg, self.device = args, lm, mtp, cfg, device
        self.use_bf16 = device.type == "cuda"
        decay, no_decay = [], []
        for module in (lm, mtp):
            for _, p in module.named_parameters():
                (decay if p.dim() >= 2 else no_decay).append(p)
        self.params = decay + no_decay
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
        )
        routers = [m for m in list(lm.modules()) + list(mtp.modules()) if isinstance(m, md.qmod.Qwen3_5MoeTopKRouter)]
        self.tap = md.RouterTap(routers)
        self.train = torch.from_numpy(train_stream.astype(np.int64)).to(device)
        self.win = args.seq_len + 1
        if self.train.numel() <= self.win:
            raise SystemExit(f"only {self.train.numel()} training tokens; need more than {self.win}")
        self.held_wins = held_wins
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(args.seed)
        self.tokens_per_step = args.batch * args.seq_len
        self.epoch_steps = self.train.numel() / self.tokens_per_step
        self.history, self.evals, self.step_times = [], [], []
        self.best = {"loss": float("inf"), "step": -1, "state": None}
        self.step = 0
        self.total = args.steps if args.steps > 0 else None
        self.limit_reason = "fixed --steps" if self.total else None
        self.stopped_by = None
        self.skipped_steps = 0

    def _eval(self) -> None:
        ev = evaluate(self.lm, self.mtp, self.held_wins, self.device, self.args.batch, self.use_bf16)
        ev.update({"step": self.step, "seconds": time.time() - self.t0})
        self.evals.append(ev)
        log(f"eval step {self.step}: held-out loss {ev['loss_main']:.4f} mtp {ev['loss_mtp']:.4f} "
            f"mtp top1 {ev['top1_mtp']:.3f} agree {ev['mtp_agrees_with_trunk_greedy']:.3f}")
        if ev["loss_main"] < self.best["loss"]:
            state = ({k: v.detach().clone() for k, v in self.lm.state_dict().items()},
                     {k: v.detach().clone() for k, v in self.mtp.state_dict().items()})
            self.best = {"loss": ev["loss_main"], "step": self.step, "state": state}

    def _one_step(self, lr: float):
        args = self.args
        for group in self.opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, self.train.numel() - self.win, (args.batch,), generator=self.gen,
                               device=self.device)
        ids = self.train[starts[:, None] + torch.arange(self.win, device=self.device)]
        self.tap.logits.clear()
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
            r = md.joint_forward(self.lm, self.mtp, ids)
            aux = md.load_balance_loss(self.tap.logits, self.cfg.num_experts_per_tok)
            loss = r["loss_main"] + args.mtp_weight * r["loss_mtp"] + args.aux_weight * aux
        self.opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return None, r, aux  # skip the update; the caller counts it
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        if not torch.isfinite(grad_norm):
            self.opt.zero_grad(set_to_none=True)
            return None, r, aux
        self.opt.step()
        return grad_norm, r, aux

    def run(self, budget: float) -> None:
        args = self.args
        self.t0 = time.time()
        eval_every = None
        while True:
            if self.total is not None and self.step >= self.total:
                self.stopped_by = "steps"
                break
            if time.time() - self.t0 > budget:
                self.stopped_by = "time"
                break
            t_step = time.time()
            lr = lr_at(self.step, self.total or 10**9, args)
            grad_norm, r, aux = self._one_step(lr)
            self.step += 1
            if grad_norm is None:
                self.skipped_steps += 1
                log(f"step {self.step}: non-finite loss or gradient, update skipped ({self.skipped_steps} so far)")
                if self.skipped_steps >= 20:
                    self.stopped_by = "non-finite"
                    break
                continue
            self.step_times.append(time.time() - t_step)
            if self.step % 10 == 0 or self.step <= args.probe_steps or self.step == self.total:
                self.history.append({
                    "step": self.step, "tokens": self.step * self.tokens_per_step, "lr": lr,
                    "loss_main": r["loss_main"].item(), "loss_mtp": r["loss_mtp"].item(), "aux": aux.item(),
                    "grad_norm": grad_norm.item(), "seconds": time.time() - self.t0,
                })
            if self.total is None and self.step >= args.probe_steps:
                times = self.step_times[2:] if len(self.step_times) > 3 else self.step_times
                per_step = float(np.median(times)) * 1.05  # periodic evaluations and jitter
                by_time = int((budget - (time.time() - self.t0)) / per_step) + self.step
                by_epochs = max(1, int(args.max_epochs * self.epoch_steps))
                self.total = max(self.step + 1, min(by_epochs, by_time))
                self.limit_reason = "max epochs" if by_epochs <= by_time else "time budget"
                log(f"probe: {per_step * 1000:.1f} ms/step -> {self.total} steps ({self.limit_reason}; one epoch = "
                    f"{self.epoch_steps:.1f} steps, {by_time} would fit the time budget)")
            if self.total is not None and eval_every is None:
                eval_every = max(1, self.total // max(1, args.evals))
            if self.step % 20 == 0 or self.step == 1:
                log(f"step {self.step}/{self.total or '?'} lr {lr:.2e} loss {r['loss_main'].item():.4f} mtp "
                    f"{r['loss_mtp'].item():.4f} aux {aux.item():.3f} gnorm {grad_norm.item():.2f} "
                    f"{self.tokens_per_step / self.step_times[-1]:.0f} tok/s")
            if eval_every and (self.step % eval_every == 0 or self.step == self.total) and self.held_wins.shape[0]:
                self._eval()

    def finish(self) -> str:
        """Evaluate the last weights if needed, then keep whichever evaluated weights were best."""
        for handle in self.tap.handles:
            handle.remove()
        if self.held_wins.shape[0] and (not self.evals or self.evals[-1]["step"] != self.step):
            try:
                self._eval()
            except Exception as exc:  # noqa: BLE001
                log(f"final periodic evaluation failed ({exc}); keeping the last weights")
                return "last (not evaluated)"
        kept = "last"
        if self.best["state"] is not None and self.best["step"] != self.step:
            self.lm.load_state_dict(self.best["state"][0])
            self.mtp.load_state_dict(self.best["state"][1])
            kept = f"best held-out (step {self.best['step']})"
        self.best["state"] = None
        return kept


def final_evaluation(args, lm, mtp, d, template, device) -> tuple[dict, list]:
    """fp32, through transformers' reference paths (eager experts, original chunked GDN)."""
    md.use_reference_paths(lm, mtp)
    win = args.seq_len + 1
    fw = args.final_eval_windows
    final = {"held_out_code": evaluate(lm, mtp, windows(d["held_code"], win, fw), device, args.batch, False)}
    if d["held_chat"].size > win:
        final["held_out_chat"] = evaluate(lm, mtp, windows(d["held_chat"], win, fw), device, args.batch, False)
    nwin = max(1, final["held_out_code"]["tokens"] // args.seq_len)
    final["train_sample"] = evaluate(lm, mtp, windows(d["train"], win, nwin), device, args.batch, False)
    acc = greedy_acceptance(lm, mtp, d["held_code"], args, device)
    samples = []
    if acc:
        seqs = acc.pop("sequences")
        for row in seqs[:3]:
            samples.append({"prompt": d["tok"].decode(row[: args.gen_prompt_len].tolist()),
                            "greedy": d["tok"].decode(row[args.gen_prompt_len:].tolist())})
    final["greedy_generation"] = acc
    chat_prompt = render_jinja_template(
        conversations=[[{"role": "user", "content": "Write a Python function `is_palindrome(s)` that returns "
                                                    "True if the string s reads the same backwards."}]],
        chat_template=template, add_generation_prompt=True, enable_thinking=False)[0][0]
    chat_ids = torch.tensor([d["tok"].encode(chat_prompt).ids], device=device)
    chat_out = greedy_generate(lm, chat_ids, args.chat_tokens, stop_id=d["ids"]["<|im_end|>"])
    samples.append({"prompt": chat_prompt,
                    "greedy": d["tok"].decode(chat_out[0, chat_ids.shape[1]:].tolist(), skip_special_tokens=False)})
    return final, samples


def main(argv=None) -> int:
    global LOG_FILE
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    LOG_FILE = os.path.join(args.out, "train_stdout.txt")
    template = open(os.path.join(HERE, "chat_template.jinja"), encoding="utf-8").read()

    # Data first: its worker pool forks, and forking is only clean before CUDA is initialised.
    t_data = time.time()
    d = build_data(args, args.work_dir, template)
    data_seconds = time.time() - t_data

    seed_all(args.seed)
    if args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": __import__("tokenizers").__version__,
        "safetensors": __import__("safetensors").__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else (platform.processor() or "cpu"),
        "cpu_count": os.cpu_count(),
        "argv": sys.argv[1:] if argv is None else argv,
    }
    log(f"env: {env}")

    max_positions = 32768
    cfg = md.make_config(d["tok"].get_vocab_size(), d["ids"], max_positions)
    seed_all(args.seed)
    lm = Qwen3_5MoeForCausalLM(cfg)
    mtp = md.MtpHead(lm.config)
    md.init_mtp(mtp, lm)
    if lm.config._attn_implementation != "sdpa" or mtp.config._attn_implementation != "sdpa":
        raise RuntimeError("the batched MTP forward relies on sdpa's is_causal; attention implementation is "
                           f"{lm.config._attn_implementation!r}")
    lm.to(device).train()
    mtp.to(device).train()
    md.use_fast_training_paths(lm, mtp, args.experts)
    n_trunk = sum(p.numel() for p in lm.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    n_embed = lm.model.embed_tokens.weight.numel()
    n_head = lm.lm_head.weight.numel()
    params = {"trunk": n_trunk, "mtp": n_mtp, "total": n_trunk + n_mtp, "embed_tokens": n_embed, "lm_head": n_head,
              "trunk_without_embeddings_and_head": n_trunk - n_embed - n_head}
    log(f"parameters: {params}")

    win = args.seq_len + 1
    trainer = Trainer(args, lm, mtp, cfg, d["train"], windows(d["held_code"], win, args.eval_windows), device)
    budget = min(args.time_budget, args.deadline - (time.time() - T_START) - args.post_reserve)
    log(f"training budget {budget:.0f}s")
    errors: list[str] = []
    t_train = time.time()
    guarded("training loop", errors, trainer.run, budget)
    train_seconds = time.time() - t_train
    log(f"training stopped after {trainer.step} steps, {train_seconds:.1f}s ({trainer.stopped_by})")
    kept = trainer.finish()
    round_to_checkpoint_dtypes(lm, mtp)

    if device.type == "cuda":  # the final numbers are fp32, not TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t_eval = time.time()
    res = guarded("final evaluation", errors, final_evaluation, args, lm, mtp, d, template, device)
    final, samples = res if res else ({}, [])
    eval_seconds = time.time() - t_eval
    log(f"final: {json.dumps(final)}")

    model_dir = os.path.join(args.work_dir, "model")
    if os.path.isdir(model_dir):
        for name in os.listdir(model_dir):
            os.remove(os.path.join(model_dir, name))
    shapes = write_model_dir(model_dir, lm, mtp, d["tok"], d["ids"], template, max_positions)
    verify = guarded("verification", errors, verify_model_dir, model_dir, lm, mtp,
                     windows(d["held_code"], win, 1).to(device), template, d["sample_conv"], d["tok"],
                     d["check_texts"]) or {}
    verify["ok"] = (
        bool(verify)
        and verify.get("trunk_logits_max_abs_diff", 1) <= 1e-4
        and verify.get("mtp_logits_max_abs_diff", 1) <= 1e-4
        and verify.get("mtp_tensor_count", 0) > 0
        and verify.get("reference_mtp_max_abs_diff", 0.0) <= 1e-3  # absent only if tools/reference failed to import
        and verify.get("tokenizer_roundtrip") is True
        and verify.get("tokenizer_matches_trained") is True
        and verify.get("chat_template_matches", True) is True
    )
    log(f"verify: {verify}")

    files = {}
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name)
        files[name] = {"bytes": os.path.getsize(path), "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}

    tr = trainer
    cfg_dict = cfg.to_dict()
    train_log = {
        "schema": 1,
        "env": env,
        "args": vars(args),
        "data": d["stats"],
        "tokenizer": {"vocab_size": d["tok"].get_vocab_size(), "special_ids": d["ids"],
                      "pre_tokenizer_regex": tb.SPLIT_REGEX},
        "architecture": {k: cfg_dict[k] for k in (
            "hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size", "rope_parameters", "vocab_size",
            "mtp_num_hidden_layers", "tie_word_embeddings")},
        "parameters": params,
        "training": {
            "steps": tr.step,
            "planned_steps": tr.total,
            "step_limit": tr.limit_reason,
            "stopped_by": tr.stopped_by,
            "skipped_steps": tr.skipped_steps,
            "tokens_per_step": tr.tokens_per_step,
            "tokens_seen": tr.step * tr.tokens_per_step,
            "epochs": tr.step * tr.tokens_per_step / max(1, tr.train.numel()),
            "kept_weights": kept,
            "best_eval_step": tr.best["step"],
            "precision": ("bf16 autocast, fp32 master weights, fp32 gated-delta chunk rule"
                          if tr.use_bf16 else "fp32"),
            "optimizer": f"AdamW(lr={args.lr}, betas=(0.9,0.95), wd={args.weight_decay} on matrices), clip 1.0, "
                         f"warmup {args.warmup} steps + cosine to {args.min_lr_ratio}x",
            "loss": f"CE(next token) + {args.mtp_weight} * CE_mtp(token after next) + "
                    f"{args.aux_weight} * load balance",
            "history": tr.history,
            "evals": tr.evals,
        },
        "final_eval": final,
        "samples": samples,
        "verify": verify,
        "errors": errors,
        "files": files,
        "tensor_shapes": shapes,
        "timings": {
            "data_and_tokenizer": round(data_seconds, 2),
            "train": round(train_seconds, 2),
            "final_eval": round(eval_seconds, 2),
            "total_until_pack": round(time.time() - T_START, 2),
            "ms_per_step_median": round(1000 * float(np.median(tr.step_times)), 2) if tr.step_times else None,
        },
    }
    guarded("plot", errors, plot_loss, train_log, os.path.join(args.out, "loss.png"))
    pack(model_dir, args.out, train_log)
    log(f"done in {time.time() - T_START:.1f}s; results in {args.out}; errors: {errors or 'none'}")
    return 0 if not errors and verify["ok"] else 1


def plot_loss(train_log: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        log(f"matplotlib unavailable ({exc}); no loss.png")
        return
    hist = train_log["training"]["history"]
    evals = train_log["training"]["evals"]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if hist:
        x = [h["tokens"] / 1e6 for h in hist]
        ax.plot(x, [h["loss_main"] for h in hist], label="train loss (next token)", lw=1)
        ax.plot(x, [h["loss_mtp"] for h in hist], label="train loss (MTP, token after next)", lw=1)
    if evals:
        tps = train_log["training"]["tokens_per_step"]
        ex = [e["step"] * tps / 1e6 for e in evals]
        ax.plot(ex, [e["loss_main"] for e in evals], "o-", ms=3, label="held-out loss (next token)")
        ax.plot(ex, [e["loss_mtp"] for e in evals], "s-", ms=3, label="held-out loss (MTP)")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("tiny-coder: qwen3_5_moe_text + MTP, Python stdlib")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def pack(model_dir: str, out: str, train_log: dict) -> None:
    """tar of the model directory, split into <= 15 MiB parts (the transfer limit is 16 MiB per file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(model_dir)):
            info = tar.gettarinfo(os.path.join(model_dir, name), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(os.path.join(model_dir, name), "rb") as fh:
                tar.addfile(info, fh)
    blob = buf.getvalue()
    parts = []
    for i in range(0, len(blob), PART_BYTES):
        name = f"tiny-coder.tar.part-{i // PART_BYTES:02d}"
        with open(os.path.join(out, name), "wb") as fh:
            fh.write(blob[i : i + PART_BYTES])
        parts.append(name)
    train_log["package"] = {"parts": parts, "tar_bytes": len(blob), "tar_sha256": hashlib.sha256(blob).hexdigest()}
    with open(os.path.join(out, "train_log.json"), "w") as fh:
        json.dump(train_log, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    sys.exit(main())
