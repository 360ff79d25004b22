#!/usr/bin/env bash
# Installs the Debian packages PureDrive builds against, and headless Chromium with a font for the web page
# tests (tests/server/test_web_page.py). Idempotent: does nothing when all are present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev
      libfmt-dev libgtest-dev libgmock-dev libboost-dev libssl-dev zlib1g-dev curl python3 python3-venv
      clang clang-format libclang-rt-dev chromium fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
