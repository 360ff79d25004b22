#!/usr/bin/env bash
# Train the bundled tiny coder.
#
#   bash tools/train/train.sh              # the real run (GPU; writes the packed results to $OUT)
#   bash tools/train/train.sh --smoke      # a CPU smoke test of the whole pipeline at toy scale (~2-4 min)
#
# Extra arguments go to tools/train/train.py (e.g. --time-budget 300). Python: $PY, else python3.
# Afterwards: python tools/train/write_card.py --results <folder with the results> --model-dir models/tiny-coder
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PY:-python3}
export PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export MPLCONFIGDIR=${MPLCONFIGDIR:-$repo/build/train-mplconfig}

if [[ "${1:-}" == "--smoke" ]]; then
  shift
  out=${OUT:-$repo/build/train-smoke/out}
  mkdir -p "$out"
  exec "$py" "$here/train.py" --out "$out" --work-dir "$repo/build/train-smoke/work" --device cpu \
    --max-files 80 --held-out-per-mille 100 --chat-keep 0.5 --tool-convs 30 \
    --cpu-threads 1 --steps 30 --batch 4 --seq-len 128 --warmup 5 --evals 3 --eval-windows 8 --final-eval-windows 16 \
    --gen-prompts 2 --gen-prompt-len 32 --gen-tokens 12 --chat-tokens 12 --time-budget 900 --deadline 1800 "$@"
fi

: "${OUT:?set OUT to the folder that receives the results}"
exec "$py" "$here/train.py" --out "$OUT" --work-dir "$repo/build/train" "$@"
