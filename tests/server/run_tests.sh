#!/usr/bin/env bash
# ctest entry of the Python server suite: makes the venv, then runs pytest against a real `puredrive serve`
# that the suite starts itself (conftest.py). Usage: run_tests.sh PUREDRIVE_BIN VENV_DIR [pytest args...]
# Exit 77 (ctest SKIP) when the venv cannot be created, with a banner that is hard to miss.
# PD_SERVE_ARGS selects what is served (default: the test-only fake engine, which only the test binary
# puredrive_fake_serve has), e.g.
#   tests/server/run_tests.sh build/default/bin/puredrive_fake_serve /tmp/venv
#   PD_SERVE_ARGS="--model models/tiny-coder" tests/server/run_tests.sh build/default/bin/puredrive /tmp/venv
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: run_tests.sh PUREDRIVE_BIN VENV_DIR}
venv=${2:?usage: run_tests.sh PUREDRIVE_BIN VENV_DIR}
shift 2
if ! "$here/setup.sh" "$venv" > "$venv.setup.log" 2>&1; then
  cat "$venv.setup.log" >&2
  cat >&2 <<BANNER
################################################################################
##  SKIPPED: server Python suite. The virtual environment could not be made   ##
##  from tests/server/requirements.txt (no PyPI access?). See the log above.  ##
##  The OpenAI- and Anthropic-client tests DID NOT RUN.                       ##
################################################################################
BANNER
  exit 77
fi
export PD_BIN=$bin
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here" "$@"
