#!/usr/bin/env bash
# `make fixtures`: sets up the pinned reference venv, then regenerates tests/fixtures/<name>/ (all, or those named).
# Usage: tools/reference/make_fixtures.sh [fixture-name ...]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

"$here/setup.sh"
venv="${PD_REFERENCE_VENV:-$here/.venv}"

# tiny-coder is the bundled trained model (models/tiny-coder), made by make_model_fixture.py; the others are random
# checkpoints made by make_fixtures.py.
random_names=()
model_fixture=$([[ $# -eq 0 ]] && echo 1 || echo 0)
for name in "$@"; do
  if [[ "$name" == tiny-coder ]]; then model_fixture=1; else random_names+=("$name"); fi
done

# The reference runs on the CPU only; keep any GPU out of it so the results do not depend on the machine.
export CUDA_VISIBLE_DEVICES="" PYTHONHASHSEED=0
if [[ $# -eq 0 || ${#random_names[@]} -gt 0 ]]; then
  args=(--out "$root/tests/fixtures")
  if [[ ${#random_names[@]} -gt 0 ]]; then
    args+=(--only "${random_names[@]}")
  fi
  "$venv/bin/python" "$here/make_fixtures.py" "${args[@]}"
fi
if [[ $model_fixture -eq 1 ]]; then
  "$venv/bin/python" "$here/make_model_fixture.py" --model "$root/models/tiny-coder" --out "$root/tests/fixtures/tiny-coder"
fi
