#!/usr/bin/env python3
"""Reference outputs for the C++ Jinja interpreter and chat-template renderer.

Renders with transformers' own chat-template machinery (transformers.utils.chat_template_utils:
_compile_jinja_template / render_jinja_template, i.e. the ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, loopcontrols, the custom tojson filter, raise_exception and strftime_now), so the expected
strings are exactly what apply_chat_template produces. strftime_now is pinned to FIXED_DATE.

Writes (committed test data):
  tests/templates/snippets.json         small feature templates (snippets.py) and their outputs or errors
  tests/templates/conversations.json    the conversations of conversations.py
  tests/templates/expected/<name>.json  per chat template in tests/data/templates: output or error for
                                        every conversation, plus the template's sha256

Usage: tools/reference/.venv/bin/python tools/reference/templates/make_reference.py [--templates DIR]
"""

import argparse
import datetime
import hashlib
import json
import pathlib
import sys

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conversations import CONVERSATIONS  # noqa: E402
from snippets import SNIPPETS  # noqa: E402
import test_data  # noqa: E402

FIXED_DATE = datetime.datetime(2025, 7, 26, 10, 30, 5)
ROOT = pathlib.Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "templates"

# Special tokens as each model's tokenizer_config.json names them (apply_chat_template passes
# tokenizer.special_tokens_map to the template). Keyed by template file stem.
SPECIAL_TOKENS = {
    "GLM-4.6": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "Mistral-Small-3.2-24B-Instruct-2506": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "Qwen-Qwen2.5-7B-Instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "Qwen-Qwen3-0.6B": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "Qwen3-Coder": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "Qwen3.5-4B": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "deepseek-ai-DeepSeek-V3.1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "meta-llama-Llama-3.1-8B-Instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}


class FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_DATE


def pin_clock():
    # strftime_now() calls chat_template_utils.datetime.now() at render time.
    ctu.datetime = FixedDatetime


def roundtrip(obj):
    """What the C++ side will see after reading the committed JSON."""
    return json.loads(json.dumps(obj, ensure_ascii=False))


def describe_error(e):
    error = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, jinja2.TemplateSyntaxError):
        error["line"] = e.lineno
    return error


def render_snippets():
    results = []
    names = set()
    for name, source, context in SNIPPETS:
        assert name not in names, f"duplicate snippet {name}"
        names.add(name)
        context = roundtrip(context)
        entry = {"name": name, "template": source, "context": context}
        try:
            entry["output"] = ctu._compile_jinja_template(source).render(**context)
        except Exception as e:  # noqa: BLE001 - every failure is a reference result
            entry["error"] = describe_error(e)
        results.append(entry)
    return results


def render_template(source, special, conversations):
    results = {}
    for conv in conversations:
        kwargs = dict(special)
        kwargs.update(conv["kwargs"])
        try:
            rendered, _ = ctu.render_jinja_template(
                conversations=[conv["messages"]],
                tools=conv["tools"],
                documents=None,
                chat_template=source,
                add_generation_prompt=conv["add_generation_prompt"],
                **kwargs,
            )
            results[conv["name"]] = {"output": rendered[0]}
        except Exception as e:  # noqa: BLE001
            results[conv["name"]] = {"error": describe_error(e)}
    return results


def fnv1a64(data):
    """Cheap content check the C++ test can recompute without a crypto library."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({len(text)} bytes)")


# The Qwen3 model directory, relative to the build's test-data directory (tests/data/CMakeLists.txt unpacks it).
CLI_MODEL_DIR = "qwen3"
CLI_CASES = ["multi_turn", "thinking_disabled", "tool_call_parallel", "unicode_heavy", "reasoning_content_history"]


def write_cli_cases(conversations):
    """End-to-end cases for `puredrive template`: the real tokenizer's apply_chat_template on a model dir."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(test_data.qwen3_dir()))
    cli_dir = OUT / "cli"
    manifest = []
    by_name = {c["name"]: c for c in conversations}
    for name in CLI_CASES:
        conv = by_name[name]
        prompt = tokenizer.apply_chat_template(
            conv["messages"], tools=conv["tools"], add_generation_prompt=conv["add_generation_prompt"],
            tokenize=False, **conv["kwargs"])
        write_json(cli_dir / f"{name}.messages.json", conv["messages"])
        if conv["tools"] is not None:
            write_json(cli_dir / f"{name}.tools.json", conv["tools"])
        (cli_dir / f"{name}.expected.txt").write_bytes(prompt.encode("utf-8"))
        manifest.append({
            "name": name,
            "model_dir": CLI_MODEL_DIR,
            "messages": f"tests/templates/cli/{name}.messages.json",
            "tools": f"tests/templates/cli/{name}.tools.json" if conv["tools"] is not None else "",
            "add_generation_prompt": conv["add_generation_prompt"],
            "kwargs": json.dumps(conv["kwargs"]),
            "expected": f"tests/templates/cli/{name}.expected.txt",
        })
    write_json(cli_dir / "cases.json", {"cases": manifest})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--templates", default=test_data.TEMPLATES, type=pathlib.Path)
    args = parser.parse_args()
    pin_clock()

    generator = {
        "script": "tools/reference/templates/make_reference.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "fixed_date": FIXED_DATE.isoformat(),
    }
    write_json(OUT / "snippets.json", {"generator": generator, "snippets": render_snippets()})

    conversations = []
    for name, messages, tools, add_generation_prompt, kwargs in CONVERSATIONS:
        conversations.append(roundtrip({
            "name": name, "messages": messages, "tools": tools,
            "add_generation_prompt": add_generation_prompt, "kwargs": kwargs,
        }))
    assert len({c["name"] for c in conversations}) == len(conversations)
    write_json(OUT / "conversations.json", {"generator": generator, "conversations": conversations})

    write_cli_cases(conversations)

    templates = sorted(args.templates.glob("*.jinja"))
    if not templates:
        sys.exit(f"no *.jinja templates in {args.templates}")
    for path in templates:
        source = path.read_text(encoding="utf-8")
        special = SPECIAL_TOKENS.get(path.stem)
        if special is None:
            sys.exit(f"no special tokens configured for {path.name}; add it to SPECIAL_TOKENS")
        results = render_template(source, special, conversations)
        failures = sum(1 for r in results.values() if "error" in r)
        print(f"{path.name}: {len(results) - failures} rendered, {failures} raised")
        write_json(OUT / "expected" / f"{path.stem}.json", {
            "generator": generator,
            "template_file": path.name,
            "template_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "template_fnv1a64": fnv1a64(path.read_bytes()),
            "special_tokens": special,
            "results": results,
        })


if __name__ == "__main__":
    main()
