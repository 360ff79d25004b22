#!/usr/bin/env bash
# Runs one libFuzzer target (ctest label "fuzz"). Usage: run_fuzz.sh BIN SECONDS SEED_DIR_OR_FILE...
# New corpus entries go to a temporary directory, so the committed seeds stay as they are. A crash leaves its
# input under build/fuzz/fuzz-artifacts/ and prints it in base64: add it to tests/fuzz/regressions/<target>/
# together with the fix, where every build replays it.
set -uo pipefail
bin=${1:?usage: run_fuzz.sh BIN SECONDS SEEDS...}
seconds=${2:?usage: run_fuzz.sh BIN SECONDS SEEDS...}
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=$(basename "$bin")
artifacts="$(dirname "$bin")/fuzz-artifacts/$name"
mkdir -p "$artifacts" "$work/corpus" "$work/seeds"
# libFuzzer takes directories: single seed files are copied into one.
dirs=("$work/corpus" "$work/seeds")
for s in "$@"; do
  if [ -d "$s" ]; then dirs+=("$s"); elif [ -f "$s" ]; then cp "$s" "$work/seeds/"; fi
done
log="$work/log"
"$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "${dirs[@]}" > "$log" 2>&1
rc=$?
grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log"
if [ $rc -ne 0 ]; then
  tail -n 60 "$log"
  for f in "$artifacts"/*; do
    [ -f "$f" ] && { echo "== $f (base64)"; base64 -w0 "$f" | head -c 20000; echo; }
  done
  echo "$name: FAILED (exit $rc)"
  exit 1
fi
echo "$name: ${seconds}s, no crash"
