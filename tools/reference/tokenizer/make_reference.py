#!/usr/bin/env python3
"""Reference outputs of Python `tokenizers` for the C++ tokenizer tests (committed under tests/tokenizer/).

  qwen3_reference.jsonl         corpus string -> ids (add_special_tokens=True), and decode(ids) where it
                                differs from the string (NFC), decode(ids, skip_special_tokens=True)
                                where that differs again
  qwen3_decode_reference.jsonl  id sequences (random, cut mid-character, invalid UTF-8) -> decode text
  qwen3_meta.json               vocab size, special-token ids (transformers), id <-> token samples
  utf8_lossy_reference.jsonl    broken UTF-8 byte strings -> bytes.decode(errors="replace")
  regex_reference.json          Oniguruma matches (through a Split pre-tokenizer) of patterns on
                                texts where PCRE2 and Oniguruma could differ
  features/*.json               small tokenizer.json files exercising options Qwen does not use
                                (Split behaviours, normalizers, added-token flags, BPE options,
                                post-processors, both merge formats), each with encode/decode cases

Usage (from the repository root):
  /work/venvs/ref/bin/python tools/reference/tokenizer/make_reference.py \
      [--tokenizer-dir DIR (default: tests/data/qwen3, unpacked)] [--out tests/tokenizer]
Versions: tokenizers and transformers as pinned in tools/reference/requirements.txt (the venv that
tools/reference/setup.sh creates, e.g. /work/venvs/ref).
"""
import argparse
import copy
import hashlib
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import make_corpus  # noqa: E402
import test_data  # noqa: E402

SEED = 1234


def dump_line(f, obj):
    f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")


def qwen_reference(tok_dir, out_dir, corpus):
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    path = os.path.join(out_dir, "qwen3_reference.jsonl")
    all_ids = []
    with open(path, "w", encoding="utf-8") as f:
        for text in corpus:
            ids = tok.encode(text, add_special_tokens=True).ids
            all_ids.append(ids)
            rec = {"text": text, "ids": ids}
            decoded = tok.decode(ids, skip_special_tokens=False)
            if decoded != text:
                rec["decoded"] = decoded
            skipped = tok.decode(ids, skip_special_tokens=True)
            if skipped != decoded:
                rec["decoded_skip"] = skipped
            dump_line(f, rec)
    print(f"{path}: {len(corpus)} strings", file=sys.stderr)
    return tok, all_ids


def decode_reference(tok, out_dir, all_ids):
    rng = random.Random(SEED)
    vocab = tok.get_vocab(with_added_tokens=True)
    n = max(vocab.values()) + 1
    added = sorted(t for t, i in vocab.items() if i >= 151643)
    # Tokens that are a single byte >= 0x80 in byte-level form: fragments of multi-byte characters.
    fragments = sorted(i for t, i in vocab.items() if len(t) == 1 and ord(t) >= 0xA1 and i < 151643)
    seqs = []
    for _ in range(150):  # random ids, including a few beyond the vocabulary
        seqs.append([rng.randrange(n + 50) for _ in range(rng.randint(1, 20))])
    for _ in range(150):  # fragments of multi-byte characters, in and out of order
        seqs.append([rng.choice(fragments + [vocab[rng.choice(added)], 33, 220])
                     for _ in range(rng.randint(1, 12))])
    for _ in range(200):  # encoded corpus strings cut at random points
        ids = rng.choice([x for x in all_ids if len(x) > 2])
        a = rng.randrange(len(ids))
        b = rng.randrange(a, len(ids)) + 1
        seqs.append(ids[a:b])
    path = os.path.join(out_dir, "qwen3_decode_reference.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for ids in seqs:
            dump_line(f, {"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                          "text_skip": tok.decode(ids, skip_special_tokens=True)})
    print(f"{path}: {len(seqs)} sequences", file=sys.stderr)


def meta_reference(tok, tok_dir, out_dir):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    rng = random.Random(SEED + 1)
    vocab = tok.get_vocab(with_added_tokens=True)
    sample_ids = sorted(set(rng.sample(range(max(vocab.values()) + 1), 300)) | set(range(151640, 151670)))
    with open(os.path.join(tok_dir, "tokenizer.json"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    meta = {
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_json_sha256": digest,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "eos_token_id": hf.eos_token_id,
        "bos_token_id": hf.bos_token_id,
        "pad_token_id": hf.pad_token_id,
        "special_ids": sorted(hf.all_special_ids),
        "id_to_token": {str(i): tok.id_to_token(i) for i in sample_ids},
        "token_to_id": {t: tok.token_to_id(t) for t in
                        [tok.id_to_token(i) for i in sample_ids if tok.id_to_token(i) is not None]},
    }
    path = os.path.join(out_dir, "qwen3_meta.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
    print(f"{path}", file=sys.stderr)


# --- small tokenizers exercising the options Qwen does not use -------------------------------------

TRAIN_TEXT = [v for v in make_corpus.PROSE.values()] + [s for v in make_corpus.CODE_SNIPPETS.values() for s in v]

FEATURE_TEXTS = [
    "", " ", "a", "Hello world", "hello  world ", "  leading and trailing  ", "tab\tseparated\tvalues",
    "line one\nline two\r\nline three\n", "x-y-z--w", "a1b22c333", "2024-06-07 12:34:56", "don't DON'T we'll",
    "café CAFÉ cafe\u0301", "ﬁne ﬂow Ｗｉｄｅ １２３", "Ünïcödé ñ ß", "中文字符 and 日本語", "emoji 😀👍🏽 ok",
    "<s>start</s>", "<mask> My name <mask> A<mask> <mask>ony <mask>", "hi <sep> there\t<sep>\t<sep>\u2000",
    "[CLS] mid [CLS]x x[CLS] [SEP][SEP]", "word<tok>word <tok> <tok><tok>", "yesterday Yesterday YESTERDAY",
    "ＨＥＬＬＯ hello", "<a><b> <a> <b><a>", "unknown ☃ snowman ☃☃", "zzz qqq", "\u00a0nbsp\u00a0", "---",
    "a--b", "-a-", "ab cd ef", "    ", "\n\n\n", "x", "the end.",
]


def train_base(vocab_size=420, **bpe_kwargs):
    tok = Tokenizer(models.BPE(**bpe_kwargs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<unk>"])
    tok.train_from_iterator(TRAIN_TEXT * 3, trainer=trainer)
    return json.loads(tok.to_str())


def split_seq(split):
    return {"type": "Sequence", "pretokenizers": [
        split, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def legacy_merges(j):
    j = copy.deepcopy(j)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    return j


def pair_merges(j):
    j = copy.deepcopy(j)
    j["model"]["merges"] = [m.split(" ", 1) if isinstance(m, str) else m for m in j["model"]["merges"]]
    return j


def added(content, id_, special=False, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def template(j, single):
    j["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": single,
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                                              "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}}
    return j


def tiny_merge_order():
    # Merge ranks decide the result: "b c" outranks "a b", so "abc" must not become "ab"+"c".
    vocab = {c: i for i, c in enumerate("abcd")}
    for t in ["bc", "ab", "abc", "cd", "bcd", "dd", "ddd", "dddd", "aa", "aaa"]:
        vocab[t] = len(vocab)
    merges = [["b", "c"], ["a", "b"], ["bc", "d"], ["d", "d"], ["ab", "c"], ["a", "bc"], ["dd", "dd"],
              ["dd", "d"], ["c", "d"], ["a", "a"], ["aa", "a"]]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}


def subword_prefix_suffix(n_merges=300):
    """A BPE with continuing_subword_prefix "##" and end_of_word_suffix "</w>". Trained here with a
    deterministic tie-break (HF's trainer breaks ties differently from run to run)."""
    from collections import Counter

    def symbols(word):
        syms = [c if i == 0 else "##" + c for i, c in enumerate(word)]
        syms[-1] += "</w>"
        return tuple(syms)

    words = Counter(symbols(w) for text in TRAIN_TEXT for w in text.split())
    vocab = {}
    for w in sorted(words):
        for sym in w:
            vocab.setdefault(sym, len(vocab))
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        merged = a + b[2:]  # HF drops the right part's "##"
        merges.append([a, b])
        vocab.setdefault(merged, len(vocab))
        new_words = Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed",
                              "invert": False},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "##",
                      "end_of_word_suffix": "</w>", "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}


def feature_tokenizers():
    base = train_base()
    n = max(base["model"]["vocab"].values()) + 1
    feats = {}

    j = legacy_merges(base)
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    feats["bytelevel_prefix_space_template"] = template(j, [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                            {"Sequence": {"id": "A", "type_id": 0}},
                                                            {"SpecialToken": {"id": "</s>", "type_id": 0}}])
    j = pair_merges(base)
    j["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0],
                           "trim_offsets": True, "add_prefix_space": False}
    feats["pair_merges_roberta"] = j

    j = copy.deepcopy(base)  # Llama-3 style: ByteLevel offsets, then a template adding <s>
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}]}
    feats["sequence_post_processor"] = j

    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            j = copy.deepcopy(base)
            j["pre_tokenizer"] = split_seq({"type": "Split", "pattern": {"Regex": r"\s+|\d|-"},
                                            "behavior": behavior, "invert": invert})
            feats[f"split_{behavior}_{'inv' if invert else 'fwd'}"] = j
    j = copy.deepcopy(base)
    j["pre_tokenizer"] = split_seq({"type": "Split", "pattern": {"String": "-"}, "behavior": "Removed",
                                    "invert": False})
    feats["split_string"] = j
    j = copy.deepcopy(base)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"[\p{Han}\p{Hiragana}]+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    feats["split_chain_digits_han"] = j

    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Prepend", "prepend": "_"}]}
    feats["normalizer_nfd_replace_strip_prepend"] = j
    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"String": "-"}, "content": " minus "}]}
    feats["normalizer_nfkc_replace_string"] = j
    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "NFKD"}
    feats["normalizer_nfkd"] = j

    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "NFKC"}
    j["added_tokens"] += [
        added("<mask>", n, special=True, lstrip=True, rstrip=True, single_word=True),
        added("<sep>", n + 1, special=False, lstrip=True, rstrip=True),
        added("[CLS]", n + 2, special=True),
        added("[SEP]", n + 3, special=True, single_word=True),
        added("<tok>", n + 4, special=False, single_word=True),
        added("yesterday", n + 5, special=False, normalized=True),
        added("HELLO", n + 6, special=False, normalized=True),
        added("<a>", n + 7, special=False, normalized=False),
        added("<a><b>", n + 8, special=True, normalized=False),
        added("<b>", n + 9, special=False, rstrip=True),
        added("the", n + 10, special=False, single_word=True),
    ]
    feats["added_token_flags"] = template(j, [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                              {"Sequence": {"id": "A", "type_id": 0}}])

    j = copy.deepcopy(base)
    j["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False}
    j["model"]["unk_token"] = "<unk>"
    j["model"]["fuse_unk"] = False
    feats["unk_no_fuse"] = j
    j = copy.deepcopy(feats["unk_no_fuse"])
    j["model"]["fuse_unk"] = True
    feats["unk_fuse"] = j
    j = copy.deepcopy(feats["unk_no_fuse"])
    j["model"]["unk_token"] = None
    feats["no_unk_drops_chars"] = j
    j = copy.deepcopy(feats["unk_no_fuse"])
    j["model"]["ignore_merges"] = True
    feats["ignore_merges"] = j
    j = copy.deepcopy(feats["unk_no_fuse"])
    j["model"]["byte_fallback"] = True
    for b in range(256):
        j["model"]["vocab"][f"<0x{b:02X}>"] = n + 20 + b
    feats["byte_fallback"] = j

    feats["subword_prefix_suffix"] = subword_prefix_suffix()
    feats["tiny_merge_order_pairs"] = tiny_merge_order()
    feats["tiny_merge_order_legacy"] = legacy_merges(tiny_merge_order())
    return feats


TINY_TEXTS = ["abc", "abcd", "abcabc", "dcba", "aaaa", "aaaaa", "dddd", "ddddd", "bcbcd", "ab cd", "abbc",
              "cdcd", "a", "", "dabcd", "aaabcdddd"]


def features_reference(out_dir):
    fdir = os.path.join(out_dir, "features")
    os.makedirs(fdir, exist_ok=True)
    for name, j in sorted(feature_tokenizers().items()):
        tok = Tokenizer.from_str(json.dumps(j))
        texts = TINY_TEXTS if name.startswith("tiny") else FEATURE_TEXTS
        cases = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=True).ids
            cases.append({"text": text, "ids": ids,
                          "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        # The JSON as written here (not tok.to_str(), which would rewrite legacy merges as pairs).
        doc = {"tokenizer": j, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
               "cases": cases}
        with open(os.path.join(fdir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
    print(f"{fdir}: {len(os.listdir(fdir))} tokenizers", file=sys.stderr)


def utf8_reference(out_dir):
    """Python's bytes.decode(errors="replace") on byte strings full of broken UTF-8."""
    rng = random.Random(SEED + 2)
    pieces = [b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b"\xed\xa0\x80",
              b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\x80", b"a", b" ",
              b"\xf0\x90\x80", b"\xe0\xa0", b"\xc2", "é€😀中".encode()]
    cases = [b"", b"\xff\xfe", b"\xf0\x9f\x98", b"\xe2\x82\xac\xe2\x82"]
    for _ in range(400):
        cases.append(b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 10))))
    for _ in range(200):
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))))
    path = os.path.join(out_dir, "utf8_lossy_reference.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for b in cases:
            dump_line(f, {"bytes": b.hex(), "text": b.decode("utf-8", errors="replace")})
    print(f"{path}: {len(cases)} byte strings", file=sys.stderr)


REGEX_CASES = [
    (r"\s+", ["a \u0085b\u00a0c\u2028d\u200be\u180ef\x1cg\ufeffh\u3000i\x0bj"]),
    (r"\S+", ["a \u0085b\u00a0c\u2028d\u200be\u180ef\x1cg\ufeffh"]),
    (r"\w+", ["héllo wörld_1 ٣٤ x\u0301y \u200d z\u2160 \u00b2 \u203f 中文 \U0001E4D0\U000105C0"]),
    (r"\d+", ["12 ٣٤ ۵ ० ① ² \U0001E4F0\U0001E4F1 ７"]),
    (r"\p{L}+|\p{N}+", ["abc\U0001E4D0\U000105C0 \U00031350 \u0cf3 \U0001D2C0 x\U00016D40y"]),
    (r"[^\s\p{L}\p{N}]+", ["a!@#b  \u2427\u0897 c"]),
    (r"\P{L}+", ["ab12 cd\U0001E4D0!"]),
    (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", ["it'S it'ſ 'LL 'Ll 'lL 'RE 'Ve 'M 'D 'K"]),
    (r"(?i)straße", ["STRASSE Straße STRAẞE strasse"]),
    (r"\s+(?!\S)|\s+", ["a   b    \n\n  c  "]),
    (r"^\w+|\w+$", ["first mid last\nsecond mid end"]),
    (r"a.c", ["abc a\nc a\rc"]),
    (r"x*", ["axxbx"]),
    (r"\h+", ["deadBEEF xyz 12"]),
    (r"[\w\s]+", ["ab c!d\te"]),
    (r"\p{Lu}\p{Ll}+", ["Hello World ÉCOLE École Ǆemal ǅemal"]),
    (r"[\p{Han}\p{Hiragana}\p{Katakana}]+", ["漢字ひらがなカタカナabc한글"]),
    (r"\u00e9+", ["ééé e\u0301"]),
    (r"\p{N}{1,3}", ["1234567 ٣٤٥٦"]),
    (r"[^\r\n\p{L}\p{N}]?\p{L}+", ["\u0085abc\u00a0def\r\nghi"]),
]


def regex_reference(out_dir):
    from tokenizers import Regex
    from tokenizers.pre_tokenizers import Split
    cases = []
    for pattern, texts in REGEX_CASES:
        split = Split(Regex(pattern), "removed", invert=True)  # keeps exactly the matches
        for text in texts:
            cases.append({"pattern": pattern, "text": text,
                          "matches": [piece for piece, _ in split.pre_tokenize_str(text)]})
    path = os.path.join(out_dir, "regex_reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    print(f"{path}: {len(cases)} cases", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=None, help="default: tests/data/qwen3, unpacked")
    ap.add_argument("--out", default="tests/tokenizer")
    args = ap.parse_args()
    if args.tokenizer_dir is None:
        args.tokenizer_dir = str(test_data.qwen3_dir())
    os.makedirs(args.out, exist_ok=True)
    corpus = make_corpus.build_corpus()
    tok, all_ids = qwen_reference(args.tokenizer_dir, args.out, corpus)
    decode_reference(tok, args.out, all_ids)
    meta_reference(tok, args.tokenizer_dir, args.out)
    features_reference(args.out)
    utf8_reference(args.out)
    regex_reference(args.out)


if __name__ == "__main__":
    main()
