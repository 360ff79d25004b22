#!/usr/bin/env bash
# ctest entry of the mlx-lm cross-checks: makes the venv (tools/quantize/setup.sh), then runs compare_mlx_lm.py
# (or the script named third, e.g. check_synth_mlx_lm.py). Usage: run_compare.sh PUREDRIVE_BIN [VENV_DIR]
# [SCRIPT]. Exit 77 (ctest SKIP) when the venv cannot be made.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: run_compare.sh PUREDRIVE_BIN [VENV_DIR]}
venv=${2:-$here/.venv}
script=${3:-compare_mlx_lm.py}
mkdir -p "$(dirname "$venv")"
if ! "$here/setup.sh" "$venv" > "$venv.setup.log" 2>&1; then
  cat "$venv.setup.log" >&2
  cat >&2 <<BANNER
################################################################################
##  SKIPPED: mlx-lm cross-check of puredrive quantize. The virtual           ##
##  environment could not be made from tools/quantize/requirements.txt      ##
##  (no PyPI access?). See the log above. The comparison DID NOT RUN.       ##
################################################################################
BANNER
  exit 77
fi
exec "$venv/bin/python" "$here/$script" "$bin"
