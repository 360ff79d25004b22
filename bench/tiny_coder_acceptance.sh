#!/usr/bin/env bash
# MTP acceptance of the bundled tiny coder on held-out code: 20 prompts cut from the standard-library files that
# the training split held out (models/tiny-coder/train_log.json), greedy, --mtp-draft K vs --no-mtp.
# Prints tokens per cycle per prompt and checks that the MTP output equals the plain output byte for byte.
# Usage: bench/tiny_coder_acceptance.sh [PUREDRIVE_BIN] [K] [N_TOKENS]
# PD_MTP_ARGS: more flags for the MTP runs, e.g. the draft-side options "--mtp-draft-vocab 2048 --mtp-window 64"
# (docs/DESIGN.md §4.8): they change the acceptance, never the text.
set -euo pipefail
bin=${1:-build/default/bin/puredrive}
k=${2:-2}
n=${3:-128}
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
files=$(python3 -c 'import json; d=json.load(open("models/tiny-coder/train_log.json")); print(" ".join(d["data"]["held_out_files"]))' 2> /dev/null || true)
[ -n "$files" ] || files="asyncio/taskgroups.py mailbox.py selectors.py wave.py"
total_tok=0 total_cyc=0 count=0 mismatch=0
for f in $files; do
  [ -f "$stdlib/$f" ] || continue
  # Up to 3 prompts per file: the first 40 lines after each of the first three "def " lines.
  for start in $(grep -n '^\s*def ' "$stdlib/$f" | head -3 | cut -d: -f1); do
    [ $count -ge 20 ] && break 2
    prompt=$(sed -n "$((start > 20 ? start - 20 : 1)),$((start))p" "$stdlib/$f")
    plain=$("$bin" generate --model models/tiny-coder --prompt "$prompt" -n "$n" --no-mtp --temp 0 --ignore-eos 2> /dev/null)
    mtp_json=$("$bin" generate --model models/tiny-coder --prompt "$prompt" -n "$n" --mtp-draft "$k" --mtp-adaptive off ${PD_MTP_ARGS:-} --temp 0 --ignore-eos --json 2> /dev/null)
    mtp_text=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["text"], end="")' <<< "$mtp_json")
    tpc=$(python3 -c 'import json,sys; s=json.loads(sys.stdin.read())["stats"]; print(s["tokens_per_cycle"])' <<< "$mtp_json")
    same=yes
    [ "$plain" == "$mtp_text" ] || { same=NO; mismatch=$((mismatch + 1)); }
    count=$((count + 1))
    printf '%-28s line %5d  tokens/cycle %.3f  identical %s\n' "$f" "$start" "$tpc" "$same"
    total_tok=$(python3 -c "print($total_tok + $tpc)")
  done
done
python3 -c "print(f'prompts {$count}, K={$k}, {$n} tokens each${PD_MTP_ARGS:+, $PD_MTP_ARGS}: mean tokens/cycle {$total_tok/$count:.3f}, mismatches {$mismatch}')"
[ "$mismatch" -eq 0 ]
