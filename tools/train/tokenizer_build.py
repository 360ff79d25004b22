"""Byte-level BPE tokenizer for the tiny coder, in the Qwen layout (tokenizer.json + tokenizer_config.json).

Pipeline like Qwen2/Qwen3: NFC normalizer; pre-tokenizer = Split on the Qwen2 regex (isolated) then ByteLevel without
prefix space and without its own regex; ByteLevel decoder. The special tokens come after the learned vocabulary,
as in Qwen's tokenizers, so the total vocabulary is exactly `vocab_size`.
"""

from __future__ import annotations

import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# The Qwen2 pre-tokenization pattern (contractions, letters with one leading non-letter, single digits,
# punctuation runs, newlines, whitespace).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special). "special" tokens are dropped by skip_special_tokens; the others are ordinary added tokens,
# as in Qwen's tokenizers (the model writes <think>, <tool_call> ... as text the parser reads back).
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
]

EOS = "<|im_end|>"
PAD = "<|endoftext|>"


def build_tokenizer(texts, vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = None
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=min_frequency,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    from tokenizers import AddedToken

    for content, special in ADDED_TOKENS:
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def token_ids(tok: Tokenizer) -> dict[str, int]:
    return {content: tok.token_to_id(content) for content, _ in ADDED_TOKENS}


def write_tokenizer_files(tok: Tokenizer, out_dir: str, chat_template: str, model_max_length: int) -> None:
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    ids = token_ids(tok)
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[c]): {
                "content": c,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": s,
            }
            for c, s in ADDED_TOKENS
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
