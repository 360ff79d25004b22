"""The third-party test inputs of tests/data/ for the reference scripts.

tests/data/qwen3/ holds tokenizer.json xz-compressed (in a one-file tar, which CMake unpacks natively) beside
tokenizer_config.json. qwen3_dir() unpacks both into a model directory that `tokenizers` and transformers can
load, as the build does into build/<preset>/test-data/qwen3.
"""
import pathlib
import shutil
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
TEMPLATES = DATA / "templates"

_qwen3 = None


def qwen3_dir() -> pathlib.Path:
    """A temporary model directory with the Qwen3 tokenizer.json and tokenizer_config.json (unpacked once)."""
    global _qwen3
    if _qwen3 is None:
        out = pathlib.Path(tempfile.mkdtemp(prefix="pd_qwen3_"))
        with tarfile.open(DATA / "qwen3" / "tokenizer.json.tar.xz") as tar:
            tar.extract("tokenizer.json", out, filter="data")
        shutil.copyfile(DATA / "qwen3" / "tokenizer_config.json", out / "tokenizer_config.json")
        _qwen3 = out
    return _qwen3
