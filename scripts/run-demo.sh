#!/usr/bin/env bash
# make run: starts `puredrive serve` on the bundled model, sends one chat request with curl, prints the
# reply and stops the server. Usage: scripts/run-demo.sh PUREDRIVE_BIN MODEL_DIR
set -euo pipefail
bin=$1
model=$2
alias_name=$(basename "$model")
out=$(mktemp)
log=$(mktemp)
"$bin" serve --model "$model" --model-alias "$alias_name" --port 0 > "$out" 2> "$log" &
pid=$!
cleanup() {
  kill "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  rm -f "$out" "$log"
}
trap cleanup EXIT

# The server prints "listening on http://HOST:PORT" once the model is loaded.
for _ in $(seq 1 3000); do
  grep -q "listening on" "$out" && break
  if ! kill -0 "$pid" 2> /dev/null; then
    echo "puredrive serve failed to start:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
url=$(grep -o 'http://[^ ]*' "$out" | head -n1)
if [[ -z "$url" ]]; then
  echo "puredrive serve did not come up within 300 s:" >&2
  cat "$log" >&2
  exit 1
fi
echo "server: $url (model $alias_name)"

question="Write a Python function that checks whether a string is a palindrome."
echo "user: $question"
echo
reply=$(curl -sS "$url/v1/chat/completions" -H 'Content-Type: application/json' -d @- << JSON
{"model": "$alias_name", "messages": [{"role": "user", "content": "$question"}], "max_tokens": 256, "temperature": 0,
 "chat_template_kwargs": {"enable_thinking": false}}
JSON
)
if command -v python3 > /dev/null; then
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
if "error" in r:
    sys.exit("error: " + r["error"]["message"])
m = r["choices"][0]["message"]
if m.get("reasoning_content"):
    print("reasoning:", m["reasoning_content"])
print("assistant:", m.get("content") or "")
u = r["usage"]
print("(%d prompt + %d completion tokens, finish_reason %s)"
      % (u["prompt_tokens"], u["completion_tokens"], r["choices"][0]["finish_reason"]))
' "$reply"
else
  echo "$reply"
fi
echo "--- server log ---"
cat "$log"
