"""Training data for the tiny coder: the running interpreter's standard library (PSF License) plus chat samples.

Everything is deterministic for a given interpreter: files are visited in sorted order, duplicates are dropped by
content hash (first path wins), and the held-out split is a hash of the path, so a file lands on the same side on
every machine that has it. The standard library differs between Python versions, so the log records which one.

Documents produced:
  * code: each source file's text, as is;
  * chat: one conversation per sampled documented function (user asks for it by signature/docstring, the
    assistant answers with the code), rendered with our chat template;
  * tool: a few synthetic tool-call conversations (search_code / read_file / run_python) in the XML format.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import random
import sys
import sysconfig

LICENSE_NOTE = (
    "Python standard library sources of the interpreter that ran the training (Python Software Foundation "
    "License Version 2, https://docs.python.org/3/license.html); derived chat samples carry the same license."
)

# Directory names never descended into: installed third-party packages (other licenses) and caches.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_TEST_DIRS = {"test", "tests", "idle_test"}


@dataclasses.dataclass
class SourceFile:
    relpath: str
    text: str
    sha256: str
    held_out: bool


@dataclasses.dataclass
class Corpus:
    root: str
    python_version: str
    files: list[SourceFile]
    stats: dict


def is_held_out(relpath: str, per_mille: int) -> bool:
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < per_mille


def collect_stdlib(
    include_tests: bool = True, max_bytes: int = 200_000, held_out_per_mille: int = 20, max_files: int = 0
) -> Corpus:
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and (include_tests or d not in _TEST_DIRS))
        if any(p in _SKIP_DIRS for p in parts):
            continue
        for name in filenames:
            if name.endswith(".py"):
                paths.append("/".join(parts + [name]))
    paths.sort()

    stats = {"candidates": len(paths), "too_big": 0, "not_utf8": 0, "empty": 0, "duplicate": 0}
    seen: set[str] = set()
    files: list[SourceFile] = []
    for rel in paths:
        full = os.path.join(root, *rel.split("/"))
        if os.path.islink(full) and not os.path.realpath(full).startswith(os.path.realpath(root)):
            continue
        size = os.path.getsize(full)
        if size > max_bytes:
            stats["too_big"] += 1
            continue
        raw = open(full, "rb").read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats["not_utf8"] += 1
            continue
        if not text.strip() or "\x00" in text:
            stats["empty"] += 1
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            stats["duplicate"] += 1
            continue
        seen.add(digest)
        files.append(SourceFile(rel, text, digest, is_held_out(rel, held_out_per_mille)))
        if max_files and len(files) >= max_files:
            break
    stats["kept"] = len(files)
    stats["held_out"] = sum(f.held_out for f in files)
    stats["bytes_train"] = sum(len(f.text.encode()) for f in files if not f.held_out)
    stats["bytes_held_out"] = sum(len(f.text.encode()) for f in files if f.held_out)
    stats["include_tests"] = include_tests
    stats["max_file_bytes"] = max_bytes
    manifest = hashlib.sha256("\n".join(f"{f.relpath} {f.sha256}" for f in files).encode()).hexdigest()
    stats["manifest_sha256"] = manifest
    return Corpus(root, sys.version.split()[0], files, stats)


# ---------------------------------------------------------------------------------------------------------------
# Chat samples from documented functions

SYSTEM_PROMPTS = [
    "You are a helpful coding assistant.",
    "You are tiny-coder, a small model that writes Python.",
    "Answer with Python code.",
]

_ASK_TEMPLATES = [
    "Write a Python function `{sig}`.\n\n{doc}",
    "{doc}\n\nImplement this as `{sig}`.",
    "Implement `{sig}` in Python. It should do the following:\n{doc}",
    "Complete this function:\n\n```python\ndef {sig}:\n    \"\"\"{doc}\"\"\"\n```",
    "How would you write `{sig}`?",
]

_ANSWER_PREFIXES = ["", "", "Here is an implementation:\n\n", "Sure:\n\n", "This does it:\n\n"]


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{fn.name}({ast.unparse(fn.args)})"


def _first_paragraph(doc: str, limit: int = 600) -> str:
    para = doc.strip().split("\n\n")[0].strip()
    return " ".join(line.strip() for line in para.splitlines())[:limit]


class _Segments:
    """ast.get_source_segment without its per-call re-split of the whole file (quadratic on big files)."""

    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)

    def get(self, node) -> str | None:
        if getattr(node, "end_lineno", None) is None:
            return None
        first, last = node.lineno - 1, node.end_lineno - 1
        if last >= len(self.lines):
            return None
        # Column offsets are UTF-8 byte offsets.
        if first == last:
            return self.lines[first].encode()[node.col_offset : node.end_col_offset].decode()
        head = self.lines[first].encode()[node.col_offset :].decode()
        tail = self.lines[last].encode()[: node.end_col_offset].decode()
        return head + "".join(self.lines[first + 1 : last]) + tail


def _parse(text: str):
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _statements(body):
    """Statements reachable through statement bodies only (cheaper than ast.walk over every expression)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, field, None) or [])
        for handler in getattr(node, "handlers", None) or []:
            yield from _statements(handler.body)


def analyze_file(f: SourceFile, seed: int, keep_prob: float):
    """(conversations built from this file's documented functions, its public top-level definitions)."""
    tree = _parse(f.text)
    if tree is None:
        return [], []
    rng = random.Random(f"{seed}:{f.relpath}")
    seg = _Segments(f.text)
    out = []
    for node in _statements(tree.body):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20:
            continue
        if rng.random() >= keep_prob:
            continue
        src = seg.get(node)
        if not src or not (80 <= len(src) <= 2500):
            continue
        src = _dedent(src, node.col_offset)
        if node.decorator_list:
            decorators = [seg.get(d) for d in node.decorator_list]
            src = "".join(f"@{d}\n" for d in decorators if d) + src
        sig = _signature(node)
        ask = rng.choice(_ASK_TEMPLATES).format(sig=sig, doc=_first_paragraph(doc))
        module = f.relpath[:-3].replace("/", ".").removesuffix(".__init__")
        if rng.random() < 0.3:
            ask += f"\n\n(It is in the `{module}` module.)"
        answer = rng.choice(_ANSWER_PREFIXES) + "```python\n" + src + "\n```"
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        out.append({"messages": messages})
    defs = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            src = seg.get(node)
            if src and 60 <= len(src) <= 1200:
                defs.append((f.relpath, node.name, node.lineno, node.end_lineno, src))
    return out, defs


def _dedent(src: str, indent: int) -> str:
    # A segment starts at the def keyword but its later lines keep the def's own indentation; remove it.
    if indent == 0:
        return src
    lines = src.split("\n")
    return "\n".join([lines[0]] + [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[1:]])


# ---------------------------------------------------------------------------------------------------------------
# Synthetic tool-call conversations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "description": "Find where a name is defined in the Python standard library.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string", "description": "Function or class name."}},
                "required": ["name"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read lines of a source file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "start_line": {"type": "integer"},
                    "end_line": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run a Python snippet and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    },
]


def _call(function: str, **args) -> dict:
    return {"type": "function", "function": {"name": function, "arguments": args}}


def tool_conversations(defs: list[tuple], rng: random.Random, count: int) -> list[dict]:
    """Deterministic synthetic conversations; the run_python results are computed here from our own snippets."""
    out = []
    for i in range(count):
        kind = i % 3
        if kind < 2 and defs:
            path, name, start, end, src = defs[rng.randrange(len(defs))]
            where = f"{path}:{start}"
            msgs = [
                {"role": "user", "content": rng.choice(
                    [f"Where is `{name}` defined? Show me the code.", f"Show me the source of {name}.",
                     f"Find `{name}` in the standard library and explain what it is."])},
                {"role": "assistant", "content": "", "tool_calls": [_call("search_code", name=name)]},
                {"role": "tool", "content": where},
                {"role": "assistant", "content": "",
                 "tool_calls": [_call("read_file", path=path, start_line=start, end_line=end)]},
                {"role": "tool", "content": src},
                {"role": "assistant",
                 "content": f"`{name}` is defined in `{path}` at line {start}:\n\n```python\n{src}\n```"},
            ]
        else:
            a, b = rng.randrange(2, 50), rng.randrange(2, 50)
            snippets = [
                (f"print(sum(range({a})))", str(sum(range(a)))),
                (f"print({a} * {b})", str(a * b)),
                (f"print(len('{'x' * (a % 13 + 1)}'))", str(a % 13 + 1)),
                (f"print(sorted([{a}, {b}, {a + b}]))", str(sorted([a, b, a + b]))),
                (f"print({a} ** 2 - {b})", str(a**2 - b)),
            ]
            code, result = snippets[rng.randrange(len(snippets))]
            msgs = [
                {"role": "user", "content": f"What does this print?\n\n```python\n{code}\n```"},
                {"role": "assistant", "content": "Let me run it.", "tool_calls": [_call("run_python", code=code)]},
                {"role": "tool", "content": result},
                {"role": "assistant", "content": f"It prints `{result}`."},
            ]
        out.append({"messages": msgs, "tools": TOOLS})
    return out


def _analyze(args):
    return analyze_file(*args)


def build_conversations(corpus: Corpus, seed: int, keep_prob: float, tool_count: int, workers: int = 0):
    """Returns (train conversations, held-out conversations); held-out ones come only from held-out files."""
    jobs = [(f, seed, keep_prob) for f in corpus.files]
    workers = workers or min(16, os.cpu_count() or 1)
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_analyze, jobs, chunksize=8)
    else:
        results = [_analyze(j) for j in jobs]
    train, held, defs = [], [], []
    for f, (samples, file_defs) in zip(corpus.files, results):
        (held if f.held_out else train).extend(samples)
        if not f.held_out:
            defs.extend(file_defs)
    train += tool_conversations(defs, random.Random(seed), tool_count)
    return train, held
