#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment of the server test suite from requirements.txt (PyPI).
# Usage: tests/server/setup.sh VENV_DIR. A stamp with the requirements' hash makes reruns instant.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:?usage: setup.sh VENV_DIR}
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
# Two suites (ctest -j) may ask for the same venv at once: one builds it, the other waits.
mkdir -p "$(dirname "$venv")"
exec 9> "$venv.lock"
flock 9
if [[ -f "$venv/.requirements.sha256" && "$(cat "$venv/.requirements.sha256")" == "$want" ]]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
echo "$want" > "$venv/.requirements.sha256"
