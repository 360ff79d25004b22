#!/usr/bin/env bash
# Every C++ and CUDA source git tracks is formatted as .clang-format says (one style; `make format` fixes it).
set -euo pipefail
root=$1
cd "$root"
if ! git rev-parse --git-dir > /dev/null 2>&1; then
  echo "check_format: $root is not a git checkout" >&2
  exit 1
fi
files=$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
# shellcheck disable=SC2086
if ! clang-format --dry-run --Werror $files; then
  echo "check_format: the files above are not formatted; run make format" >&2
  exit 1
fi
echo "check_format: $(echo "$files" | wc -l) files formatted"
