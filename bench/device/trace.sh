#!/usr/bin/env bash
# A kernel timeline of the synthetic 35B decode step on the GPU machine, from a bundle built with
# PD_KERNEL_TRACE=1 bench/device/prepare.sh (src/puredrive/backend/cuda/trace.cuh). Usage (device tool):
#   run(command="bash bench/device/trace.sh", carry=["build/device-bundle.tar.xz"])
# Environment: PD_QUANTS (default bf16), PD_TRACE_VARIANTS (';'-separated lists of VAR=value pairs,
# ','-separated, each traced once more; e.g. "PD_SMEM_CARVEOUT=100"), PD_TOKENS (default 48).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/pd-trace-out}
mkdir -p "$out"
rm -rf build/trace build/device-bundle.tmp && mkdir -p build/device-bundle.tmp
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' build/device-bundle.tar.xz \
  build/device-bundle.tmp
mv build/device-bundle.tmp/device-bundle build/trace && rm -rf build/device-bundle.tmp
head -2 build/trace/build_info.txt | tee "$out/summary.txt"
IFS=';' read -ra variants <<<";${PD_TRACE_VARIANTS:-}"
for q in ${PD_QUANTS:-bf16}; do
  for i in "${!variants[@]}"; do
    v=${variants[$i]}
    name=${q}_v$i
    IFS=',' read -ra envs <<<"$v"
    env ${envs[@]+"${envs[@]}"} LD_LIBRARY_PATH=build/trace/lib PD_TRACE_FILE=/tmp/trace_$name.bin timeout 200 \
      build/trace/bin/puredrive_device bench --synth qwen3.5-35b-a3b --quant "$q" --contexts 2k \
      --tokens "${PD_TOKENS:-48}" --profile-steps 0 --json "$out/bench_$name.json" >"$out/bench_$name.log" 2>&1
    echo "== $name [${v:-no variant}] rc=$? $(grep -o '[0-9.]* tok/s' "$out/bench_$name.log" | head -1)" | tee -a "$out/summary.txt"
    for r in 1 3; do
      python3 bench/device/trace_summary.py /tmp/trace_$name.bin --rows $r >"$out/trace_${name}_r$r.txt" 2>&1
    done
    head -5 "$out/trace_${name}_r1.txt" | tee -a "$out/summary.txt"
  done
done
# The device tool returns few files: the traces' summaries and the records go back as one archive.
tar -C "$out" -czf "$out/trace.tar.gz" $(cd "$out" && ls trace_*.txt bench_* 2>/dev/null) && (cd "$out" && rm -f trace_*.txt bench_*)
