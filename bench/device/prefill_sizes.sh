#!/usr/bin/env bash
# Prefill speed of the synthetic 35B by prompt length and chunk size, one bench call per cell (decode kept
# short), for the candidate bundle that compare.sh unpacked (build/cand) or the bundle folder given.
#   run(command="PD_PREFILL_CELLS='8k:2048 8k:8192 32k:8192' bash bench/device/prefill_sizes.sh", ...)
# PD_PREFILL_CELLS: context:chunk pairs (default "8k:2048 8k:4096 8k:8192 32k:8192"), PD_QUANT (default
# bf16), PD_PREFILL_RUNS (prefills per cell, median; default 2), PD_PREFILL_ENV (VAR=value settings for
# every cell, in the file names too). Chunk 0: the bench chooses, as a session would. Lines go to stdout and $OUT/prefill_sizes.txt, records to $OUT/prefill_*.json.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
b=${1:-build/cand}
out=${OUT:-/tmp/pd-prefill-out}
mkdir -p "$out"
q=${PD_QUANT:-bf16}
for cell in ${PD_PREFILL_CELLS:-8k:2048 8k:4096 8k:8192 32k:8192}; do
  ctx=${cell%%:*} chunk=${cell##*:}
  # Files named by the variables too, so a variant's cell does not overwrite the plain one.
  tag=${q}_${ctx}_$chunk$(echo "${PD_PREFILL_ENV:-}" | tr -c 'A-Za-z0-9\n' _ | sed 's/^./_&/')
  j=$out/prefill_$tag.json
  env ${PD_PREFILL_ENV:-} LD_LIBRARY_PATH=$b/lib timeout 300 $b/bin/puredrive_device bench \
    --synth qwen3.5-35b-a3b --quant "$q" --contexts "$ctx" --fill real --prefill-chunk "$chunk" --tokens 8 \
    --verify-iters 1 --profile-steps 0 --prefill-runs "${PD_PREFILL_RUNS:-2}" --json "$j" \
    --commit "$(awk '/^commit/ {print $2}' $b/build_info.txt)" --note "prefill_sizes ${PD_PREFILL_ENV:-}" \
    >"$out/prefill_$tag.log" 2>&1
  python3 - "$j" "$q" "$ctx" "$chunk ${PD_PREFILL_ENV:-}" <<'PY' | tee -a "$out/prefill_sizes.txt"
import json, sys
try:
    c = json.load(open(sys.argv[1]))["cells"][0]
    print(f"{sys.argv[2]} prompt {sys.argv[3]} chunk {sys.argv[4]}: {c['prefill_tokens_per_second']:.0f} tok/s, "
          f"{c['prefill_seconds']:.3f} s; decode {c['decode_tokens_per_second']:.1f} tok/s")
except Exception as e:
    print(f"{sys.argv[2]} prompt {sys.argv[3]} chunk {sys.argv[4]}: no record ({e})")
PY
done
