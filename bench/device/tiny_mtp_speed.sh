#!/usr/bin/env bash
# The tiny coder on the GPU (issue 15): decode tok/s of --no-mtp and --mtp-draft K for greedy and seeded
# sampling over six code prompts, and whether the MTP text equals the plain text. Usage:
#   bench/device/tiny_mtp_speed.sh PUREDRIVE_BIN [K] [N_TOKENS] [RUNS]   (PD_BACKEND: default cuda; PD_MTP_ARGS)
# Prints one line per (mode, prompt) and a median summary; exits 1 when a text differs.
set -uo pipefail
bin=$1
k=${2:-2}
n=${3:-200}
runs=${4:-3}
prompts=(
  'def fibonacci(n):'
  'def parse_csv_line(line, sep=","):'
  'class Stack:'
  'def binary_search(items, target):'
  'import os\n\ndef list_python_files(root):'
  'def merge_sorted(a, b):'
)
summary=$(mktemp)
fail=0
for mode in greedy seeded; do
  case $mode in
    greedy) args=(--temp 0) ;;
    seeded) args=(--temp 0.8 --top-p 0.95 --seed 7) ;;
  esac
  for i in "${!prompts[@]}"; do
    p=$(printf '%b' "${prompts[$i]}")
    for draft in 0 "$k"; do
      mtp=(--no-mtp)
      # PD_MTP_ARGS: more options for the MTP runs, e.g. "--mtp-adaptive off".
      [ "$draft" != 0 ] && mtp=(--mtp-draft "$draft" ${PD_MTP_ARGS:-})
      best=0 text=
      for _ in $(seq "$runs"); do
        j=$("$bin" generate --model models/tiny-coder --backend "${PD_BACKEND:-cuda}" --prompt "$p" -n "$n" --ignore-eos \
          "${args[@]}" "${mtp[@]}" --json 2>/dev/null) || { echo "generate failed: $mode prompt $i draft $draft"; fail=1; continue; }
        read -r tps text_hash < <(python3 -c 'import json,sys,hashlib; d=json.loads(sys.stdin.read());
print(d["decode_tokens_per_second"], hashlib.sha256(d["text"].encode()).hexdigest()[:16])' <<<"$j")
        best=$(python3 -c "print(max($best, $tps))")
        text=$text_hash
      done
      echo "$mode $i $draft $best $text" >>"$summary"
    done
  done
done
python3 - "$summary" "$k" <<'PY'
import sys, statistics, collections
rows = [l.split() for l in open(sys.argv[1])]
k = sys.argv[2]
bad = 0
for mode in ("greedy", "seeded"):
    plain = {r[1]: r for r in rows if r[0] == mode and r[2] == "0"}
    mtp = {r[1]: r for r in rows if r[0] == mode and r[2] == k}
    ratios = []
    for i in sorted(plain):
        p, m = plain[i], mtp.get(i)
        if not m: continue
        same = p[4] == m[4]
        bad += not same
        ratios.append(float(m[3]) / float(p[3]))
        print(f"{mode:7} prompt {i}: --no-mtp {float(p[3]):8.1f} tok/s, K={k} {float(m[3]):8.1f} tok/s, identical {same}")
    if ratios:
        print(f"{mode:7} median K={k} / --no-mtp: {statistics.median(ratios):.2f}x over {len(ratios)} prompts (best of runs)")
sys.exit(1 if bad else 0)
PY
rc=$?
rm -f "$summary"
exit $((rc | fail))
