#!/usr/bin/env bash
# ctest entry: bench/api_bench.py end to end on the CPU, on a checkpoint that `synth --write` makes (the tiny
# architecture with Qwen's vocabulary, tokenizer and Qwen3.5 chat template), with the server suite's venv
# (pinned openai client). Exit 77 (ctest SKIP) when the venv cannot be made.
# Usage: api_bench_cpu.sh PUREDRIVE_BIN VENV_DIR TEST_DATA_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: api_bench_cpu.sh PUREDRIVE_BIN VENV_DIR TEST_DATA_DIR}
venv=${2:?}
data=${3:?}
if ! "$root/tests/server/setup.sh" "$venv" >"$venv.setup.log" 2>&1; then
  cat "$venv.setup.log" >&2
  echo "SKIPPED: api_bench.py on the CPU: the server suite's venv could not be made (no PyPI access?)" >&2
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/pd-api-bench-test-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin" synth --arch tiny-wide-vocab --quant q8 --write "$work/model" --tokenizer "$data/qwen3" \
  --chat-template "$root/tests/data/templates/Qwen3.5-4B.jinja" -q >/dev/null || exit 1
"$venv/bin/python" "$root/bench/api_bench.py" --bin "$bin" --model "$work/model" --backend cpu --threads 1 \
  --contexts 64 --tokens 8 --runs 2 --mtp-drafts 0,2 --json "$work/api.json" || exit 1
"$venv/bin/python" - "$work/api.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["schema"] == "puredrive-api-bench/1" and r["complete"], r
assert [s["mtp_draft"] for s in r["servers"]] == [0, 2], r["servers"]
assert all(s["listen_seconds"] > 0 and "upload_seconds" in s for s in r["servers"]), r["servers"]
assert len(r["cells"]) == 4, r["cells"]
for c in r["cells"]:
    assert c["completion_tokens"] == 8 and c["finish_reason"] == "length", c
    assert c["ttft_seconds"] > 0 and c["decode_tokens_per_second"] > 0, c
    assert c["prompt_tokens"] >= 64, c  # the 64-token prompt plus the chat template's tokens
assert len(r["summary"]) == 2, r["summary"]
print("api_bench.py on the CPU: ok")
PY
