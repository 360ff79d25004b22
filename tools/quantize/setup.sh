#!/usr/bin/env bash
# Creates (or refreshes) a venv for tools/quantize from requirements.txt with plain pip from PyPI.
# Usage: setup.sh [VENV_DIR] (default tools/quantize/.venv). Idempotent: a venv already made from the same
# requirements.txt is left untouched.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$here/.venv}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
  echo "setup.sh: need Python >= 3.10 ($python)" >&2
  exit 1
fi
if [[ ! -x "$venv/bin/python" ]]; then
  if ! "$python" -m venv "$venv"; then
    echo "setup.sh: '$python -m venv' failed; on Debian install python3-venv" >&2
    exit 1
  fi
fi
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
echo "setup.sh: venv ready at $venv"
