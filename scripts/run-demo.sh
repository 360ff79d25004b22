#!/usr/bin/env bash
# make run: what PureDrive does, in a few seconds. The bundled tiny coder writes the body of a Python function
# from its signature and docstring, with MTP speculative decoding (the model's own MTP head drafts tokens, the
# trunk verifies them); then the same prompt runs again without speculation (--no-mtp). Verification keeps
# only tokens the trunk itself would have produced, so the two answers must be byte-identical: the script
# compares them and fails if they differ.
# Usage: scripts/run-demo.sh PUREDRIVE_BIN MODEL_DIR
set -euo pipefail
bin=${1:?usage: run-demo.sh PUREDRIVE_BIN MODEL_DIR}
model=${2:?usage: run-demo.sh PUREDRIVE_BIN MODEL_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

prompt='def dedent(text):
    """Remove any common leading whitespace from every line in `text`."""
'

# Greedy, up to 128 tokens, ending at the first blank line (the end of the function).
generate() {
  local name=$1
  shift
  if ! "$bin" generate --model "$model" --prompt "$prompt" -n 128 --temp 0 --stop $'\n\n' --stats "$@" \
    > "$work/$name.txt" 2> "$work/$name.log"; then
    echo "run-demo: puredrive generate $* failed:" >&2
    cat "$work/$name.log" >&2
    exit 1
  fi
}

# From generate's stderr: "... decode N tokens at X tok/s (...)" and "stats: ..., tokens/cycle T, ...".
field() {
  sed -n "$2" "$work/$1.log" | head -n1
}

# Every step speculative (--mtp-adaptive off): the MTP answer comes from cycles, not from plain steps.
generate mtp --mtp-adaptive off
generate plain --no-mtp

echo "prompt ($(basename "$model")):"
printf '%s' "$prompt"
echo
echo "answer:"
cat "$work/mtp.txt"
echo
tps_mtp=$(field mtp 's/.*decode \([0-9]* tokens at [0-9.]* tok\/s\).*/\1/p')
tpc=$(field mtp 's/.*tokens\/cycle \([0-9.]*\).*/\1/p')
tps_plain=$(field plain 's/.*decode \([0-9]* tokens at [0-9.]* tok\/s\).*/\1/p')
if [[ -z "$tps_mtp" || -z "$tpc" || -z "$tps_plain" ]]; then
  echo "run-demo: could not read the statistics of puredrive generate:" >&2
  cat "$work/mtp.log" "$work/plain.log" >&2
  exit 1
fi
echo "with MTP:    $tps_mtp, $tpc tokens per cycle"
echo "without MTP: $tps_plain, 1 token per step"

if cmp -s "$work/mtp.txt" "$work/plain.txt"; then
  echo "--no-mtp answer: identical ($(wc -c < "$work/mtp.txt") bytes compared)"
else
  echo "run-demo: the --no-mtp answer DIFFERS from the MTP answer; speculative decoding is not exact here:" >&2
  diff "$work/mtp.txt" "$work/plain.txt" >&2 || true
  exit 1
fi
echo
echo "Serve it to OpenAI clients: $bin serve --model $model (docs/API.md)"
