#!/usr/bin/env bash
# A/B on the GPU machine: the decode benchmark of two bundles (build/device-bundle.tar.xz, the candidate, and
# build/base-bundle.tar.xz, the baseline; both made by prepare.sh) interleaved in one run, so the comparison
# does not depend on the machine's state that day; plus the candidate's CUDA tests and `check` on the
# fixtures when its bundle has them. Usage (device tool):
#   run(command="bash bench/device/compare.sh", carry=["build/device-bundle.tar.xz", "build/base-bundle.tar.xz"])
# Environment: PD_QUANTS (default "bf16 q8 q6"), PD_BASE_QUANTS (the formats the baseline is measured in
# too, default PD_QUANTS), PD_CONTEXTS (default 2k), PD_ROUNDS (default 2), PD_TOKENS (default 256),
# PD_TESTS (test binaries), PD_TEST_S (seconds per test binary, default 300), PD_SKIP_TESTS=1,
# PD_SKIP_CHECK=1, PD_CHECK_S (seconds per `check`, default 60), PD_NCU_QUANTS (candidate only, default
# none; PD_NCU_BUNDLES="cand base" for the baseline too) with PD_NCU_CONTEXTS (default 2k; --fill auto) and PD_NCU_ROWS (rows of the profiled step, default 1) and PD_NCU_DETAIL (kernel-name regex for
# full ncu sections; PD_NCU_SECTIONS replaces the default list of --section options), PD_NCU_PREFILL (quants: kernels of the candidate's last prefill chunk; PD_NCU_PREFILL_DETAIL: kernel-name regex for their full sections), PD_CAND_LONG (contexts for one more candidate bf16 bench, --fill auto: synthetic
# above 64K, e.g. 32k,128k,256k; default none; PD_BASE_LONG: the same for the baseline), PD_CAND_VARIANTS (below), PD_MTP_DRAFT (default 2; 0: none:
# MTP cycles with a scripted acceptance of PD_ACCEPT_MEAN tokens per cycle, default 2.3, in every cell of the
# bundles whose bench has --accept-mean; PD_MTP_DRAFT_VOCAB: their --mtp-draft-vocab), PD_PREFILL_RUNS (bench --prefill-runs).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/pd-compare-out}
mkdir -p "$out"
det=$out/detail  # logs and records, packed into detail.tar.gz at the end (the device tool returns few files)
mkdir -p "$det"
export PATH=$PATH:/usr/local/cuda/bin
unpack() {  # tarball -> folder
  local dir=$root/build/$2
  rm -rf "$dir" "$root/build/device-bundle.tmp"
  mkdir -p "$root/build/device-bundle.tmp"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$root/build/device-bundle.tmp"
  mv "$root/build/device-bundle.tmp/device-bundle" "$dir"
  rm -rf "$root/build/device-bundle.tmp"
  local src
  src=$(cat "$dir/source_dir")
  if [ "$src" != "$root" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
}
unpack build/device-bundle.tar.xz cand
# Without a baseline bundle (the tree and two bundles can pass the device tool's 64 MiB), set PD_BASE_QUANTS=""
# and compare against the candidate's own switches (PD_CAND_VARIANTS, e.g. PD_GEMV_STREAM=0).
rm -rf build/base
[ -f build/base-bundle.tar.xz ] && unpack build/base-bundle.tar.xz base
for b in cand base; do
  [ -f build/$b/build_info.txt ] && echo "$b: $(head -2 build/$b/build_info.txt | tr '\n' ' ')"
done | tee "$out/summary.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$out/summary.txt"

with() {  # bundle command...
  local b=$1
  shift
  LD_LIBRARY_PATH=$root/build/$b/lib "$@"
}
if [ "${PD_SKIP_TESTS:-0}" != 1 ]; then
  for t in ${PD_TESTS:-cuda_ops_tests cuda_model_tests cuda_sampling_tests cuda_upload_tests cuda_generator_tests}; do
    [ -x build/cand/bin/$t ] || continue
    with cand timeout "${PD_TEST_S:-300}" build/cand/bin/$t >"$det/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$det/$t.log" | tr '\n' ' ')" | tee -a "$out/summary.txt"
    grep -E '^\[  FAILED  \]' "$det/$t.log" | head -20 | tee -a "$out/summary.txt"
    if [ "$t" = cuda_ops_tests ]; then  # the prefill paths that the wgmma kernels replace by default
      with cand env PD_ATTN_WGMMA=0 PD_MMA_TMA=0 timeout 120 build/cand/bin/$t \
        --gtest_filter='CudaAttention.Prefill*:CudaPrefill.*:CudaInputNorm.Matmuls*' >"$det/${t}_mma_sync.log" 2>&1
      echo "$t (mma.sync prefill) rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$det/${t}_mma_sync.log" | tr '\n' ' ')" |
        tee -a "$out/summary.txt"
    fi
  done
  if [ -x build/cand/bin/puredrive_check ] && [ "${PD_SKIP_CHECK:-0}" != 1 ]; then
    for d in tests/fixtures/*/ models/tiny-coder/; do
      d=${d%/}
      [ -f "$d/config.json" ] || continue
      [ "$d" = tests/fixtures/tiny-coder ] && continue
      case "$d" in models/*) ;; *) [ -f "$d/reference.json" ] || continue ;; esac
      with cand timeout "${PD_CHECK_S:-60}" build/cand/bin/puredrive_check check --model "$d" --backend cuda \
        >"$det/check_$(basename "$d").log" 2>&1
      echo "check $d rc=$? $(tail -1 "$det/check_$(basename "$d").log")" | tee -a "$out/summary.txt"
    done
  fi
fi
# PD_PREFILL_RUNS=N: N prefills of each cell's prompt, their median reported (bundles whose bench has it).
prefill_runs() {  # bundle
  if [ -n "${PD_PREFILL_RUNS:-}" ] && with "$1" build/"$1"/bin/puredrive_device bench --help 2>/dev/null |
    grep -q prefill-runs; then
    echo "--prefill-runs $PD_PREFILL_RUNS"
  fi
}
for q in ${PD_QUANTS:-bf16 q8 q6}; do
  for round in $(seq "${PD_ROUNDS:-2}"); do
    for b in base cand; do
      [ -d build/$b ] || continue
      # PD_BASE_QUANTS: the formats the baseline is measured in too (default all of PD_QUANTS).
      if [ $b = base ] && [ -n "${PD_BASE_QUANTS+x}" ] && ! [[ " $PD_BASE_QUANTS " == *" $q "* ]]; then continue; fi
      j=$det/bench_${b}_${q}_$round.json
      mtp=()
      if [ "${PD_MTP_DRAFT:-2}" != 0 ] && with $b build/$b/bin/puredrive_device bench --help 2>/dev/null | grep -q accept-mean; then
        mtp=(--mtp-draft "${PD_MTP_DRAFT:-2}" --accept-mean "${PD_ACCEPT_MEAN:-2.3}")
        # PD_MTP_DRAFT_VOCAB=N: the drafts' lm_head over the N most frequent ids only (a draft-side option).
        [ -n "${PD_MTP_DRAFT_VOCAB:-}" ] && mtp+=(--mtp-draft-vocab "$PD_MTP_DRAFT_VOCAB")
      fi
      with $b timeout 150 build/$b/bin/puredrive_device bench --synth qwen3.5-35b-a3b --quant "$q" \
        --contexts "${PD_CONTEXTS:-2k}" --tokens "${PD_TOKENS:-256}" --profile-steps 0 ${mtp[@]+"${mtp[@]}"} \
        $(prefill_runs $b) --json "$j" \
        --commit "$(awk '/^commit/ {print $2}' build/$b/build_info.txt)" --note "$(sed -n 2p build/$b/build_info.txt)" \
        >"$det/bench_${b}_${q}_$round.log" 2>&1
      python3 - "$j" "$b" "$round" <<'PY' | tee -a "$out/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]} round {sys.argv[3]}: no record ({e})"); sys.exit()
for c in j["cells"]:
    v = c["verify"]
    fr = f", bytes ratio {v['floor_ratio']:.2f}" if "floor_ratio" in v else ""
    if "ratio_distinct" in v:
        fr += f" (different tokens: {v['ratio_distinct']:.2f}" + (
            f", bytes {v['floor_ratio_distinct']:.2f})" if "floor_ratio_distinct" in v else ")")
    g = c.get("cuda_graphs") or {}
    print(f"{j['model']['quant']:>4} {sys.argv[2]} r{sys.argv[3]} ctx {c['context']:>6}: {c['decode_tokens_per_second']:7.1f} tok/s "
          f"({100*c['fraction_of_floor']:4.1f}% of {c['floor_tokens_per_second']:.0f}), step {c['step_ms_median']:.3f} ms, "
          f"R={v['rows']}/R=1 {v['ratio']:.2f}{fr}, nodes {g.get('nodes_in_decode_graph','-')}, prefill {c.get('prefill_tokens_per_second') or 0:.0f} tok/s, "
          f"row-exact {j.get('row_exact_check',{}).get('pass')}")
    m = c.get("mtp_cycle")
    if m:
        print(f"     MTP K={m['draft_tokens']} {m['tokens_per_cycle']:.2f} tok/cycle: cycle {m['cycle_ms']:.3f} ms = "
              f"{m['cycle_over_plain_step']:.2f}x plain step {m['plain_step_ms']:.3f} ms, {m['effective_tokens_per_second']:.1f} tok/s "
              f"= {m['speedup_over_plain']:.2f}x plain, {100*m['fraction_of_floor']:.1f}% of the cycle floor, "
              f"host waits/cycle {(m.get('cuda_graphs') or {}).get('host_waits_per_cycle', '-')}, "
              f"identity {'ok' if m['output_equals_plain'] and m['acceptance_as_scripted'] else 'FAIL'}")
PY
    done
  done
done
# PD_CAND_VARIANTS="A=1;B=2,C=3": one more candidate bench per variant (';'-separated) with those environment
# variables set (','-separated), for the quants in PD_VARIANT_QUANTS (default bf16).
IFS=';' read -ra variants <<<"${PD_CAND_VARIANTS:-}"
for v in "${variants[@]}"; do
  for q in ${PD_VARIANT_QUANTS:-bf16}; do
    IFS=',' read -ra kv <<<"$v"
    j=$det/bench_var_${q}_$(echo "$v" | tr -c 'A-Za-z0-9' _).json
    # MTP cycles as in the main cells; PD_MTP_DRAFT_VOCAB=N in a variant becomes --mtp-draft-vocab N.
    vmtp=()
    if [ "${PD_MTP_DRAFT:-2}" != 0 ]; then
      vmtp=(--mtp-draft "${PD_MTP_DRAFT:-2}" --accept-mean "${PD_ACCEPT_MEAN:-2.3}")
      for e in "${kv[@]}"; do
        case "$e" in PD_MTP_DRAFT_VOCAB=*) vmtp+=(--mtp-draft-vocab "${e#*=}") ;; esac
      done
    fi
    with cand env "${kv[@]}" timeout 150 build/cand/bin/puredrive_device bench --synth qwen3.5-35b-a3b --quant "$q" \
      --contexts "${PD_CONTEXTS:-2k}" --tokens "${PD_TOKENS:-256}" --profile-steps 0 ${vmtp[@]+"${vmtp[@]}"} \
      $(prefill_runs cand) --json "$j" --commit "$(awk '/^commit/ {print $2}' build/cand/build_info.txt)" \
      --note "$(sed -n 2p build/cand/build_info.txt); variant $v" >/dev/null 2>&1
    python3 - "$j" "$v" <<'PY' | tee -a "$out/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"variant {sys.argv[2]}: no record ({e})"); sys.exit()
for c in j["cells"]:
    v = c["verify"]
    print(f"{j['model']['quant']:>4} variant {sys.argv[2]}: {c['decode_tokens_per_second']:7.1f} tok/s, "
          f"step {c['step_ms_median']:.3f} ms, R={v['rows']}/R=1 {v['ratio']:.2f}, prefill {c.get('prefill_tokens_per_second') or 0:.0f} tok/s, "
          f"row-exact {j.get('row_exact_check',{}).get('pass')}")
    m = c.get("mtp_cycle")
    if m:
        print(f"     MTP K={m['draft_tokens']} draft vocab {m.get('mtp_draft_vocab', '-')}: cycle {m['cycle_ms']:.3f} ms = "
              f"{m['cycle_over_plain_step']:.2f}x plain, {m['effective_tokens_per_second']:.1f} tok/s = "
              f"{m['speedup_over_plain']:.2f}x plain, identity {'ok' if m['output_equals_plain'] and m['acceptance_as_scripted'] else 'FAIL'}")
PY
  done
done
# PD_CAND_LONG: the candidate's long-context cells; PD_BASE_LONG: the baseline's too (default none).
for b in cand base; do
  if [ $b = cand ]; then long=${PD_CAND_LONG:-}; else long=${PD_BASE_LONG:-}; fi
  [ -n "$long" ] && [ -d build/$b ] || continue
  with $b timeout 300 build/$b/bin/puredrive_device bench --synth qwen3.5-35b-a3b --quant bf16 \
    --contexts "$long" --fill auto --tokens 128 --profile-steps 2 --json "$det/bench_${b}_long.json" \
    --commit "$(awk '/^commit/ {print $2}' build/$b/build_info.txt)" --note "$(sed -n 2p build/$b/build_info.txt)" \
    >"$det/bench_${b}_long.log" 2>&1
  echo "$b long-context bench rc=$?" | tee -a "$out/summary.txt"
  tail -8 "$det/bench_${b}_long.log" | tee -a "$out/summary.txt"
done
# PD_NCU_BUNDLES="cand base": profile the baseline too (default: the candidate only); its files and lines say
# "base".
for nb in ${PD_NCU_BUNDLES:-cand}; do
 [ -d build/$nb ] || continue
 for q in ${PD_NCU_QUANTS:-}; do
 for ctx in ${PD_NCU_CONTEXTS:-2k}; do
 for nr in ${PD_NCU_ROWS:-1}; do
  tag=${q}_r$nr; [ "$ctx" = 2k ] || tag=${q}_${ctx}_r$nr
  [ "$nb" = cand ] || tag=${nb}_$tag
  cell=(--synth qwen3.5-35b-a3b --quant "$q" --contexts "$ctx" --fill auto --tokens 4 --verify-iters 1
    --profile-steps 1 --profile-rows "$nr")
  ncu --clock-control none --cache-control none --nvtx --nvtx-include pd_decode_step/ \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
    --log-file "$det/ncu_$tag.csv" env LD_LIBRARY_PATH=$root/build/$nb/lib build/$nb/bin/puredrive_device bench \
    "${cell[@]}" >/dev/null 2>&1
  # PD_NCU_DETAIL=regex: the full sections (occupancy, stalls, memory) of the first launch of each matching kernel.
  if [ -n "${PD_NCU_DETAIL:-}" ]; then
    ncu --clock-control none --cache-control none --nvtx --nvtx-include pd_decode_step/ \
      --kernel-name "regex:${PD_NCU_DETAIL}" --launch-count "${PD_NCU_DETAIL_N:-6}" \
      ${PD_NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis} \
      --log-file "$det/ncu_detail_$tag.txt" env LD_LIBRARY_PATH=$root/build/$nb/lib \
      build/$nb/bin/puredrive_device bench "${cell[@]}" >/dev/null 2>&1
    cp "$det/ncu_detail_$tag.txt" "$out/" 2>/dev/null
  fi
  label="$q ctx $ctx R=$nr"; [ "$nb" = cand ] || label="$nb $label"
  python3 bench/device/ncu_summary.py "$det/ncu_$tag.csv" "$label" | tee -a "$out/summary.txt"
  python3 bench/device/ncu_summary.py "$det/ncu_$tag.csv" "$label, per kernel instance" --shapes \
    | tee -a "$out/summary.txt"
 done
 done
 done
done
# PD_NCU_PREFILL="bf16 ...": the kernels of the last prefill chunk (PD_PREFILL_CONTEXT tokens, default 2k, in
# one chunk of up to 2048 rows) of the candidate, summed per kernel.
for q in ${PD_NCU_PREFILL:-}; do
  prefill_cell=(--synth qwen3.5-35b-a3b --quant "$q" --contexts "${PD_PREFILL_CONTEXT:-2k}" --tokens 2
    --verify-iters 1 --profile-steps 0)
  ncu --clock-control none --cache-control none --nvtx --nvtx-include pd_prefill_chunk/ \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
    --log-file "$det/ncu_prefill_$q.csv" env LD_LIBRARY_PATH=$root/build/cand/lib build/cand/bin/puredrive_device bench \
    "${prefill_cell[@]}" >/dev/null 2>&1
  python3 bench/device/ncu_summary.py "$det/ncu_prefill_$q.csv" "$q prefill chunk" | tee -a "$out/summary.txt"
  python3 bench/device/ncu_summary.py "$det/ncu_prefill_$q.csv" "$q prefill chunk, per kernel instance" --shapes \
    | tee -a "$out/summary.txt"
  # PD_NCU_PREFILL_DETAIL=regex: the full sections of the first PD_NCU_DETAIL_N matching launches of the chunk.
  if [ -n "${PD_NCU_PREFILL_DETAIL:-}" ]; then
    ncu --clock-control none --cache-control none --nvtx --nvtx-include pd_prefill_chunk/ \
      --kernel-name "regex:${PD_NCU_PREFILL_DETAIL}" --launch-count "${PD_NCU_DETAIL_N:-6}" \
      ${PD_NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis} \
      --log-file "$out/ncu_prefill_detail_$q.txt" env LD_LIBRARY_PATH=$root/build/cand/lib \
      build/cand/bin/puredrive_device bench "${prefill_cell[@]}" >/dev/null 2>&1
  fi
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$out/summary.txt"
tar -czf "$out/detail.tar.gz" -C "$out" detail && rm -rf "$det"
