"""Install the results of a training run into models/tiny-coder/ and write its model card.

    python tools/train/write_card.py --results DIR [--model-dir models/tiny-coder] [--no-install]

DIR holds what tools/train/train.py wrote to its --out folder: tiny-coder.tar.part-NN, train_log.json, loss.png.
The parts are joined, checked against the sha256 in train_log.json, and unpacked (each file checked again); then
train_log.json and loss.png are copied next to the model and README.md is written from train_log.json.
With --no-install only the card is (re)written, from MODEL_DIR/train_log.json.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def install(results: str, model_dir: str, log: dict) -> None:
    pkg = log.get("package")
    if not pkg:
        raise SystemExit(f"{results}/train_log.json has no 'package' entry; was the run complete?")
    blob = b""
    for part in pkg["parts"]:
        path = os.path.join(results, part)
        if not os.path.isfile(path):
            raise SystemExit(f"missing {path} (train_log.json lists parts {pkg['parts']})")
        blob += open(path, "rb").read()
    digest = hashlib.sha256(blob).hexdigest()
    if len(blob) != pkg["tar_bytes"] or digest != pkg["tar_sha256"]:
        raise SystemExit(f"joined tar is {len(blob)} bytes, sha256 {digest}; train_log.json says "
                         f"{pkg['tar_bytes']} bytes, sha256 {pkg['tar_sha256']}")
    os.makedirs(model_dir, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or member.name.startswith("."):
                raise SystemExit(f"unexpected tar member {member.name!r}")
            data = tar.extractfile(member).read()
            want = log["files"].get(member.name, {}).get("sha256")
            if hashlib.sha256(data).hexdigest() != want:
                raise SystemExit(f"{member.name}: sha256 does not match train_log.json")
            with open(os.path.join(model_dir, member.name), "wb") as fh:
                fh.write(data)
    missing = EXPECTED_FILES - set(os.listdir(model_dir))
    if missing:
        raise SystemExit(f"{model_dir} lacks {sorted(missing)} after unpacking")
    for name in ("train_log.json", "loss.png"):
        src = os.path.join(results, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(model_dir, name))


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def num(x, fmt="{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def card(log: dict, model_dir: str) -> str:
    env, data, arch, params = log["env"], log["data"], log["architecture"], log["parameters"]
    tr, final, verify, files = log["training"], log.get("final_eval", {}), log.get("verify", {}), log["files"]
    code = final.get("held_out_code", {})
    chat = final.get("held_out_chat", {})
    train_s = final.get("train_sample", {})
    gen = final.get("greedy_generation", {})
    ids = log["tokenizer"]["special_ids"]
    weights_bytes = files.get("model.safetensors", {}).get("bytes", 0)
    on_disk = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir)
                  if os.path.isfile(os.path.join(model_dir, f)) and f != "README.md")
    f_stats = data["files"]
    layer_types = arch["layer_types"]
    pattern = " ".join("A" if t == "full_attention" else "G" for t in layer_types)
    rope = arch["rope_parameters"]
    lines = []
    add = lines.append
    add("---")
    add("library_name: transformers")
    add("pipeline_tag: text-generation")
    add("tags: [qwen3_5_moe, mtp, speculative-decoding, tiny, test-model]")
    add("---")
    add("")
    add("# tiny-coder")
    add("")
    add("A tiny `qwen3_5_moe_text` model (Gated DeltaNet + gated attention in the 3:1 pattern, routed experts with a "
        "shared expert) with one MTP (multi-token prediction) layer, trained from scratch by the PureDrive project on "
        "the Python standard library. It is PureDrive's bundled default model: small enough to commit and to run in "
        "CI, real enough that its MTP head drafts tokens the trunk accepts, so speculative decoding has measurable "
        "acceptance. It writes Python-looking code; it is not a useful assistant.")
    add("")
    add("The checkpoint is in the Hugging Face layout (`config.json`, `model.safetensors`, tokenizer files, "
        "`generation_config.json`) and loads with `transformers` as `Qwen3_5MoeForCausalLM`, which ignores the "
        "`mtp.*` tensors; PureDrive uses them for drafting.")
    add("")
    add("## Data")
    add("")
    add(f"- Source: the standard library of the Python that ran the training, **Python {data['python_version']}** "
        f"(`{data['stdlib_root']}`), `.py` files only, third-party `site-/dist-packages` excluded"
        f"{', test folders included' if f_stats.get('include_tests') else ', test folders excluded'}.")
    add(f"- License of the data: {data['license']}")
    add(f"- Files: {f_stats['candidates']} candidates; skipped {f_stats['too_big']} over "
        f"{f_stats['max_file_bytes'] // 1000} KB, {f_stats['not_utf8']} not UTF-8, {f_stats['empty']} empty, "
        f"{f_stats['duplicate']} duplicates (by content hash); kept {f_stats['kept']}, of which "
        f"{f_stats['held_out']} held out (by a hash of the path, ~{log['args']['held_out_per_mille'] / 10:.0f}%). "
        f"Manifest sha256 `{f_stats['manifest_sha256'][:16]}…`.")
    add(f"- Train documents: {data['train_documents']['code']} source files and {data['train_documents']['chat']} "
        "chat conversations rendered with the chat template: a user asks for a documented stdlib function by "
        "signature or docstring (extracted with `ast`) and the assistant answers with its code, plus "
        f"{log['args']['tool_convs']} synthetic tool-call conversations (`search_code` / `read_file` / "
        "`run_python`) in the XML tool-call format.")
    add(f"- Tokens: {data['tokens']['train']:,} train, {data['tokens']['held_out_code']:,} held-out code, "
        f"{data['tokens']['held_out_chat']:,} held-out chat ({data.get('train_bytes_per_token', 'n/a')} bytes per "
        "token on the training text).")
    add("")
    add("## Tokenizer")
    add("")
    add(f"Byte-level BPE trained on the training split with Hugging Face `tokenizers`, "
        f"{log['tokenizer']['vocab_size']:,} tokens including the added ones at the end of the vocabulary (Qwen's layout): NFC normalizer, the "
        "Qwen2 split regex, `ByteLevel(add_prefix_space=false, use_regex=false)`, ByteLevel decoder.")
    add("")
    add("| token | id | special |")
    add("|---|---|---|")
    for name, tid in ids.items():
        shown = name.replace("|", "\\|")  # a bare | would split the table cell, even inside backticks
        add(f"| `{shown}` | {tid} | {'yes' if name.startswith('<|') else 'no'} |")
    add("")
    add("EOS is `<|im_end|>` (generation also stops at `<|endoftext|>`), PAD and BOS are `<|endoftext|>` (no BOS "
        "is added when encoding). The chat template (`tokenizer_config.json`, source in "
        "`tools/train/chat_template.jinja`) is our own, in the Qwen3.5 format: ChatML turns, tools listed in the "
        "system turn, tool calls as `<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n"
        "</function>\\n</tool_call>`, tool results as `<tool_response>` blocks in a user turn, and a `<think>` block "
        "(`enable_thinking=false` closes it empty).")
    add("")
    add("## Architecture")
    add("")
    add("| | |")
    add("|---|---|")
    add(f"| model_type | `qwen3_5_moe_text` (`Qwen3_5MoeForCausalLM`) |")
    add(f"| layers | {arch['num_hidden_layers']}: `{pattern}` (G = Gated DeltaNet, A = gated full attention) |")
    add(f"| hidden size | {arch['hidden_size']} |")
    add(f"| attention | {arch['num_attention_heads']} query / {arch['num_key_value_heads']} KV heads of dim "
        f"{arch['head_dim']}, output gate, q/k norm, partial RoPE {rope.get('partial_rotary_factor')} "
        f"(θ = {rope.get('rope_theta'):g}) |")
    add(f"| Gated DeltaNet | {arch['linear_num_key_heads']} key / {arch['linear_num_value_heads']} value heads, "
        f"dims {arch['linear_key_head_dim']}/{arch['linear_value_head_dim']}, conv kernel "
        f"{arch['linear_conv_kernel_dim']} |")
    add(f"| MoE (every layer) | {arch['num_experts']} experts, top-{arch['num_experts_per_tok']}, expert width "
        f"{arch['moe_intermediate_size']}, gated shared expert of width {arch['shared_expert_intermediate_size']} |")
    add(f"| MTP | {arch['mtp_num_hidden_layers']} layer (`mtp.*`): fc over [norm(embed(x_t+1)), norm(h_t)], one "
        "full-attention + MoE decoder layer, final norm, shared `lm_head`; h_t is the trunk's post-final-norm state |")
    add(f"| vocabulary | {arch['vocab_size']:,}, untied embeddings and `lm_head` |")
    add("")
    add(f"Parameters: **{params['total']:,}** in total = trunk {params['trunk']:,} (embeddings "
        f"{params['embed_tokens']:,}, `lm_head` {params['lm_head']:,}) + MTP {params['mtp']:,}. "
        f"`model.safetensors` is {weights_bytes / 1e6:.1f} MB (bf16; `A_log` in fp32); the whole folder is "
        f"{on_disk / 1e6:.1f} MB. Experts are stored fused (`mlp.experts.gate_up_proj` [E, 2I, H], "
        "`mlp.experts.down_proj` [E, H, I]), in the trunk and in the MTP layer.")
    add("")
    add("## Training")
    add("")
    extra = " ".join(a for a in env.get("argv", []) if a not in ("--out", "--work-dir") and "/" not in a)
    add(f"- Command: `bash tools/train/train.sh` (`tools/train/train.py{' ' + extra if extra else ''}`, seed "
        f"{log['args']['seed']}), on "
        f"{env['device']} with torch {env['torch']}, transformers {env['transformers']}, tokenizers "
        f"{env['tokenizers']}, Python {env['python']}.")
    add(f"- {tr['steps']} steps of {tr['tokens_per_step']:,} tokens ({log['args']['batch']} × "
        f"{log['args']['seq_len']}): {tr['tokens_seen'] / 1e6:.2f} M tokens, {tr['epochs']:.2f} epochs "
        f"(step count set by: {tr['step_limit']}; stopped by: {tr['stopped_by']}). Kept weights: {tr['kept_weights']}.")
    add(f"- {tr['optimizer']}; loss {tr['loss']}; {tr['precision']}.")
    t = log["timings"]
    add(f"- Time: data + tokenizer {t['data_and_tokenizer']:.0f} s, training {t['train']:.0f} s "
        f"({num(t.get('ms_per_step_median'), '{:.0f}')} ms/step median), final evaluation {t['final_eval']:.0f} s, "
        f"{t['total_until_pack']:.0f} s in all.")
    add("- Reproducibility: data, split, tokenizer and initialisation are deterministic for a given Python; the GPU "
        "run is not bit-for-bit reproducible (atomic-add reductions in embedding and attention backward passes; with "
        "the default `--steps 0` the step count also depends on the measured speed unless the epoch cap binds). "
        "Pass `--steps N` to fix the schedule.")
    add("")
    add("![loss curve](loss.png)")
    add("")
    add("## Evaluation")
    add("")
    add("Measured in fp32 on the shipped (bf16-rounded) weights, on held-out files never trained on.")
    add("")
    add("| metric | held-out code | held-out chat | train sample |")
    add("|---|---|---|---|")
    add(f"| next-token loss (nats) | {num(code.get('loss_main'))} | {num(chat.get('loss_main'))} | "
        f"{num(train_s.get('loss_main'))} |")
    add(f"| next-token top-1 accuracy | {pct(code.get('top1_main'))} | {pct(chat.get('top1_main'))} | "
        f"{pct(train_s.get('top1_main'))} |")
    add(f"| MTP loss, token after next (nats) | {num(code.get('loss_mtp'))} | {num(chat.get('loss_mtp'))} | "
        f"{num(train_s.get('loss_mtp'))} |")
    add(f"| MTP top-1 accuracy (draft == true x_t+2) | {pct(code.get('top1_mtp'))} | {pct(chat.get('top1_mtp'))} | "
        f"{pct(train_s.get('top1_mtp'))} |")
    add(f"| MTP draft == trunk's greedy token at t+1 | {pct(code.get('mtp_agrees_with_trunk_greedy'))} | "
        f"{pct(chat.get('mtp_agrees_with_trunk_greedy'))} | {pct(train_s.get('mtp_agrees_with_trunk_greedy'))} |")
    add("")
    if gen:
        add(f"Greedy speculative acceptance with one draft token: on {gen['prompts']} held-out prompts of "
            f"{gen['prompt_tokens']} tokens, the trunk generated {gen['generated_tokens']} tokens greedily; the MTP "
            f"draft for each next-next token equalled the trunk's greedy token **{pct(gen['k1_acceptance'])}** of "
            f"the time, i.e. {gen['k1_tokens_per_cycle']:.2f} tokens per verify step with one draft.")
        add("")
    if verify:
        add(f"Checks at the end of the run: transformers reloads the folder as `{verify.get('reload_class')}` and "
            f"reproduces the trained model's logits (max abs diff {verify.get('trunk_logits_max_abs_diff')}); the "
            f"{verify.get('mtp_tensor_count')} `mtp.*` tensors reproduce its MTP logits (max abs diff "
            f"{verify.get('mtp_logits_max_abs_diff')}); the reference MTP module in `tools/reference/` agrees "
            f"(max abs diff {verify.get('reference_mtp_max_abs_diff', verify.get('reference_mtp_error'))}); the "
            f"tokenizer round-trips and `apply_chat_template` matches our renderer: "
            f"{verify.get('tokenizer_roundtrip')} / {verify.get('chat_template_matches')}.")
        add("")
    if log.get("samples"):
        add("## Samples (greedy)")
        add("")
        for s in log["samples"][-2:]:
            add("Prompt:")
            add("")
            add("````")
            add(s["prompt"].rstrip("\n")[-600:])
            add("````")
            add("")
            add("Continuation:")
            add("")
            add("````")
            add(s["greedy"].rstrip("\n")[:1200])
            add("````")
            add("")
    add("## Files")
    add("")
    add("| file | bytes | sha256 |")
    add("|---|---|---|")
    for name, meta in sorted(files.items()):
        add(f"| `{name}` | {meta['bytes']:,} | `{meta['sha256'][:16]}…` |")
    add("")
    add("`train_log.json` holds the full record: arguments, versions, data statistics, loss history, evaluations, "
        "tensor shapes.")
    add("")
    add("## License")
    add("")
    add("Training data: Python standard library, PSF License Version 2. The weights and tokenizer are released with "
        "this repository under its license.")
    add("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", help="folder with tiny-coder.tar.part-NN, train_log.json, loss.png")
    p.add_argument("--model-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-coder"))
    p.add_argument("--no-install", action="store_true", help="only rewrite README.md from MODEL_DIR/train_log.json")
    args = p.parse_args(argv)
    model_dir = os.path.normpath(args.model_dir)
    if args.no_install:
        log = json.load(open(os.path.join(model_dir, "train_log.json")))
    else:
        if not args.results:
            p.error("--results is required unless --no-install")
        log = json.load(open(os.path.join(args.results, "train_log.json")))
        install(args.results, model_dir, log)
    with open(os.path.join(model_dir, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(card(log, model_dir))
    print(f"wrote {model_dir}/README.md")
    if log.get("errors"):
        print(f"note: the run recorded errors: {log['errors']}", file=sys.stderr)
    if not log.get("verify", {}).get("ok", False):
        print("note: the run's verification did not pass (see train_log.json 'verify')", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
