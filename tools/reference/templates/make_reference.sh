#!/usr/bin/env bash
# Regenerates tests/templates/ (chat-template and Jinja reference outputs) with the pinned reference venv.
# Reads the chat templates and the Qwen3 tokenizer from tests/data/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../setup.sh"
venv="${PD_REFERENCE_VENV:-$here/../.venv}"
HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 "$venv/bin/python" "$here/make_reference.py" "$@"
