#!/usr/bin/env bash
# Where a decode kernel's warps wait, instruction by instruction: ncu's warp-state sampling of the first
# launches of the kernels matching PD_SOURCE_KERNELS in a synthetic 35B step of PD_SOURCE_ROWS rows, the SASS
# source page exported as CSV, and a summary of the stall reasons and the instructions with the most samples
# (ncu_source_summary.py). Uses the bundle of prepare.sh (build/device-bundle), on the GPU machine:
#   run(command="bash bench/device/ncu_source.sh", carry=["build/device-bundle.tar.xz"])
# Environment: PD_SOURCE_KERNELS (kernel-name regex, default "gdn_step|attn_decode"), PD_SOURCE_ROWS (default
# "1 3"), PD_SOURCE_QUANT (default bf16), PD_SOURCE_CONTEXT (default 2k), PD_SOURCE_N (launches, default 2).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/pd-source-out}
mkdir -p "$out"
if [ ! -d build/device-bundle ]; then
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' build/device-bundle.tar.xz build
fi
export LD_LIBRARY_PATH=$root/build/device-bundle/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
head -2 build/device-bundle/build_info.txt | tee "$out/summary.txt"
work=$(mktemp -d)
for nr in ${PD_SOURCE_ROWS:-1 3}; do
  rep=$work/r$nr
  ncu --clock-control none --cache-control none --nvtx --nvtx-include pd_decode_step/ \
    --kernel-name "regex:${PD_SOURCE_KERNELS:-gdn_step|attn_decode}" --launch-count "${PD_SOURCE_N:-2}" \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats \
    --import-source no -o "$rep" build/device-bundle/bin/puredrive_device bench --synth qwen3.5-35b-a3b \
    --quant "${PD_SOURCE_QUANT:-bf16}" --contexts "${PD_SOURCE_CONTEXT:-2k}" --fill auto --tokens 4 --verify-iters 1 \
    --profile-steps 1 --profile-rows "$nr" >"$work/r$nr.log" 2>&1
  echo "== rows $nr: ncu rc=$?" | tee -a "$out/summary.txt"
  ncu -i "$rep.ncu-rep" --page raw --csv >"$work/raw_r$nr.csv" 2>&1
  ncu -i "$rep.ncu-rep" --page details >"$work/details_r$nr.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$work/source_r$nr.csv" 2>&1
  python3 bench/device/ncu_source_summary.py "$work/raw_r$nr.csv" "$work/source_r$nr.csv" "rows $nr" \
    | tee -a "$out/summary.txt"
done
tar -C "$work" -czf "$out/ncu_source.tar.gz" $(cd "$work" && ls *.csv *.txt *.log)
rm -rf "$work"
