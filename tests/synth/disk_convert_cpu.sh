#!/usr/bin/env bash
# ctest entry: bench/device/disk_models.sh's convert_checkpoint (issue 18's conversion on the GPU machine) run
# here on the tiny architecture with Qwen's vocabulary, so that its paths and the flags it passes to `synth
# --write` and `quantize` are checked against the binary before the one run at full scale. The bf16 goes to
# a temporary directory standing for /dev/shm (PD_CONVERT_DIR); run.sh's run_phase, row and note are
# replaced by minimal ones that keep its contract (a row per phase in the summary).
# Usage: disk_convert_cpu.sh PUREDRIVE_BIN TEST_DATA_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
full=${1:?usage: disk_convert_cpu.sh PUREDRIVE_BIN TEST_DATA_DIR}
data=${2:?}
cd "$root" || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/pd-disk-convert-test-XXXXXX")
trap 'rm -rf "$work"' EXIT
out=$work/out log=$work/out/run.log summary=$work/out/summary.txt
mkdir -p "$out" "$work/disk/tokenizer" "$work/shm"
cp "$data/qwen3/tokenizer.json" "$data/qwen3/tokenizer_config.json" "$work/disk/tokenizer/"
note() { echo "$*" >>"$log"; }
row() { printf '%-44s %s\n' "$1" "$2" >>"$summary"; }
run_phase() {
  local name=$1 secs=$2 rc
  shift 2
  timeout --signal=KILL "$secs" "$@" >>"$log" 2>&1
  rc=$?
  row "$name" "$([ $rc -eq 0 ] && echo ok || echo "FAIL rc=$rc")"
}
# shellcheck source=bench/device/disk_models.sh
source "$root/bench/device/disk_models.sh"
arch=tiny-wide-vocab disk=$work/disk secs=120
dst=$disk/$arch-conv-oq6e
PD_CONVERT_DIR=$work/shm convert_checkpoint oq6e "$dst"
rc=$?
cat "$summary"
fail() {
  echo "FAIL: $*" >&2
  cat "$log" >&2
  exit 1
}
[ $rc -eq 0 ] || fail "convert_checkpoint returned $rc"
[ ! -e "$work/shm/pd-convert-bf16" ] || fail "the bf16 checkpoint was not deleted"
grep -q '"quantization"' "$dst/config.json" || fail "no quantization block in $dst/config.json"
[ -f "$dst/tokenizer.json" ] || fail "the tokenizer was not copied"
grep -Eq '^synth --write .* ok$' "$summary" || fail "no synth phase row"
grep -Eq '^quantize bf16 -> oq6e +ok$' "$summary" || fail "no quantize phase row"
grep -Eq 'bf16 to memory: written .* GB/s\), peak RSS' "$summary" || fail "no bf16 write record in the summary"
grep -Eq 'time [0-9.]+ s on [0-9]+ threads?: [0-9]+ input bytes .* [0-9]+ output bytes, peak resident memory .* \([0-9]+ bytes\); the output loads' \
  "$summary" || fail "no time, bytes and peak memory line in the summary"
python3 - "$dst/config.json" <<'PY' || fail "the recipe is not oq6e's"
import json, sys
q = json.load(open(sys.argv[1]))["quantization"]
assert q["bits"] == 8 and q["group_size"] == 64, q
assert any(k.endswith("switch_mlp.gate_proj") and v["bits"] == 6 for k, v in q.items() if isinstance(v, dict)), q
PY
echo "disk_models.sh convert_checkpoint on the CPU: ok"
