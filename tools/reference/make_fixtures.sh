#!/usr/bin/env bash
# `make fixtures`: sets up the pinned reference venv, then regenerates tests/fixtures/<name>/ (all, or those named).
# Usage: tools/reference/make_fixtures.sh [fixture-name ...]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

"$here/setup.sh"
venv="${PD_REFERENCE_VENV:-$here/.venv}"

args=(--out "$root/tests/fixtures")
if [[ $# -gt 0 ]]; then
  args+=(--only "$@")
fi
# The reference runs on the CPU only; keep any GPU out of it so the results do not depend on the machine.
CUDA_VISIBLE_DEVICES="" PYTHONHASHSEED=0 "$venv/bin/python" "$here/make_fixtures.py" "${args[@]}"
