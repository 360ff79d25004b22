#!/usr/bin/env bash
# One command for the GPU machine (H200): the CUDA test suite, compute-sanitizer (memcheck on a subset,
# racecheck on a smaller one), the decode benchmark; logs, test results and benchmark JSON go to $OUT and a
# summary table is printed last. Uses the binaries staged by bench/device/prepare.sh (built on the dev
# machine; the GPU machine has no -dev packages), carried as build/device-bundle:
#   run(command="bash bench/device/run.sh", carry=["build/device-bundle"], timeout_s=420)
# (or carry=["build/device-bundle.tar.xz"]: unpacked here when the bundle folder is missing).
# Environment: PD_BUDGET_S (seconds for the whole script, default 400), PD_QUANTS (default "bf16 q8 q6"; the
# first gets PD_CONTEXTS, default 2k,32k, and PD_FIRST_BENCH_S seconds; the others PD_OTHER_CONTEXTS and
# PD_OTHER_BENCH_S), PD_TOKENS (decode tokens per cell, default 128), PD_PREFILL_CHUNK (rows per prefill
# step, default 0: the bench chooses, as a session would), PD_FILL (bench --fill, default auto: cells above 64K tokens get the
# synthetic KV / GDN fill, so PD_CONTEXTS=2k,32k,128k,256k costs about 10 s more per long cell than the
# default; give PD_FIRST_BENCH_S room for them), PD_RACECHECK_S, PD_SKIP_SANITIZER=1, PD_CHECK_S (seconds per
# `puredrive check`, default 40), PD_SKIP_CHECK=1. PD_MTP_DRAFT (default 2; 0: none): every bench cell also
# times full MTP cycles of that draft length with a scripted acceptance of PD_ACCEPT_MEAN tokens per cycle
# (default 2.3), PD_MTP_DRAFT_VOCAB (default 0: the whole vocabulary) for the head's lm_head.
# PD_DISK_MODELS="q8 oq6e": checkpoints written to disk,
# loaded, benchmarked and served (bench/device/disk_models.sh, its own PD_DISK_* settings), after the rest;
# PD_DISK_ONLY=1: only those (and the upload test), e.g.
#   run(command="PD_DISK_ONLY=1 PD_DISK_MODELS=q8 bash bench/device/run.sh", carry=[...], timeout_s=600)
# (with PD_DISK_ONLY=1, PD_TESTS lists test binaries to run first and PD_TINY_SPEED=1 adds
# bench/device/tiny_mtp_speed.sh)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bundle=$root/build/device-bundle
out=${OUT:-/tmp/pd-device-out}
mkdir -p "$out"
log=$out/run.log
summary=$out/summary.txt
: >"$log"
: >"$summary"
start=$(date +%s)
budget=${PD_BUDGET_S:-400}
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin

note() { echo "$*" | tee -a "$log"; }
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$summary" >>"$log"; }
left() { echo $((budget - ($(date +%s) - start))); }

if [ ! -x "$bundle/bin/puredrive_device" ] && [ -f "$bundle.tar.xz" ]; then
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle.tar.xz" "$root/build"
fi
if [ ! -x "$bundle/bin/puredrive_device" ]; then
  echo "no bundle at $bundle: run bench/device/prepare.sh on the dev machine and carry build/device-bundle"
  exit 2
fi
# The test binaries read tests/fixtures under the source path they were built from.
src=$(cat "$bundle/source_dir")
if [ "$src" != "$root" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi

note "== machine"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  cat "$bundle/build_info.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,power.limit --format=csv
  uname -r
} >>"$log" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
row "gpu, driver" "$gpu"
row "build" "$(head -2 "$bundle/build_info.txt" | tr '\n' ' ')"

# run_phase NAME SECONDS CMD...: runs with a time limit, records pass/fail and the gtest tally.
run_phase() {
  local name=$1 secs=$2
  shift 2
  local l
  l=$(left)
  if [ "$l" -lt 20 ]; then
    row "$name" "SKIPPED (time budget)"
    return
  fi
  [ "$secs" -gt "$l" ] && secs=$l
  note "== $name (limit ${secs}s): $*"
  local t0=$(date +%s) rc
  timeout --signal=KILL "$secs" "$@" >"$out/phase.tmp" 2>&1
  rc=$?
  cat "$out/phase.tmp" >>"$log"
  local tally
  tally=$(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test' "$out/phase.tmp" |
    sed -E 's/\[ +//;s/ +\]//;s/, listed below://' | tr '\n' ' ')
  local sani
  sani=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/phase.tmp" | tail -1)
  local status="ok"
  [ $rc -ne 0 ] && status="FAIL rc=$rc"
  [ $rc -eq 137 ] && status="TIMEOUT after ${secs}s"
  row "$name" "$status $(($(date +%s) - t0))s ${tally}${sani}"
  grep -E '^\[  FAILED  \]' "$out/phase.tmp" | head -20 >>"$summary"
  [ $rc -ne 0 ] && tail -3 "$out/phase.tmp" | sed 's/^/    | /' >>"$summary"
  rm -f "$out/phase.tmp"
}

bin=$bundle/bin
# shellcheck source=bench/device/disk_models.sh
source "$root/bench/device/disk_models.sh"
[ -x "$bin/cuda_upload_tests" ] && run_phase "cuda_upload_tests" 60 "$bin/cuda_upload_tests"
if [ "${PD_DISK_ONLY:-0}" = 1 ]; then
  # PD_TESTS: test binaries of the bundle to run first; PD_TINY_SPEED=1: the tiny coder's MTP speed on the GPU.
  for t in ${PD_TESTS:-}; do run_phase "$t" 150 "$bin/$t"; done
  if [ "${PD_TINY_SPEED:-0}" = 1 ] && [ -x "$bin/puredrive" ]; then
    run_phase "tiny coder MTP speed (K=2)" 240 bash bench/device/tiny_mtp_speed.sh "$bin/puredrive" 2 200 2
    grep -E 'median|identical False' "$log" | tail -4 | sed 's/^/  /' >>"$summary"
  fi
  disk_models
  echo
  echo "== summary ($(($(date +%s) - start)) s; full log: run.log)"
  cat "$summary"
  exit 0
fi
run_phase "cuda_ops_tests" 150 "$bin/cuda_ops_tests"
# The prefill paths that Hopper's wgmma kernels replace by default stay tested: the same tests on mma.sync.
run_phase "cuda_ops_tests (mma.sync prefill)" 60 env PD_ATTN_WGMMA=0 PD_MMA_TMA=0 "$bin/cuda_ops_tests" \
  --gtest_filter='CudaAttention.Prefill*:CudaPrefill.*:CudaInputNorm.Matmuls*'
run_phase "cuda_model_tests" 150 "$bin/cuda_model_tests"
run_phase "cuda_sampling_tests" 150 "$bin/cuda_sampling_tests"
[ -x "$bin/cuda_generator_tests" ] && run_phase "cuda_generator_tests" 150 "$bin/cuda_generator_tests"
[ -x "$bin/cuda_prefix_cache_tests" ] && run_phase "cuda_prefix_cache_tests" 150 "$bin/cuda_prefix_cache_tests"

# Synthetic weights generated on the device equal the host-materialised ones: same greedy tokens on CUDA and CPU.
for q in bf16 q6; do
  a=$(timeout 60 "$bin/puredrive_device" synth --arch tiny --quant "$q" --backend cuda -n 16 --json 2>>"$log")
  b=$(timeout 60 "$bin/puredrive_device" synth --arch tiny --quant "$q" --backend cpu -n 16 --json 2>>"$log")
  echo "synth tiny $q cuda: $a" >>"$log"
  echo "synth tiny $q cpu:  $b" >>"$log"
  ta=$(echo "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])' 2>/dev/null)
  tb=$(echo "$b" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])' 2>/dev/null)
  if [ -n "$ta" ] && [ "$ta" = "$tb" ]; then row "synth tiny $q: cuda tokens == cpu tokens" "ok $ta"; else
    row "synth tiny $q: cuda tokens == cpu tokens" "FAIL cuda=$ta cpu=$tb"; fi
done

commit=$(awk '/^commit/ {print $2}' "$bundle/build_info.txt")
dirty=$(sed -n 2p "$bundle/build_info.txt")
contexts=${PD_CONTEXTS:-2k,32k}
tokens=${PD_TOKENS:-128}
mtp_args=()
if [ "${PD_MTP_DRAFT:-2}" != 0 ]; then
  mtp_args=(--mtp-draft "${PD_MTP_DRAFT:-2}" --accept-mean "${PD_ACCEPT_MEAN:-2.3}"
    --mtp-draft-vocab "${PD_MTP_DRAFT_VOCAB:-0}")
fi
bench() {
  local q=$1 secs=$2 ctx=$3
  run_phase "bench $q $ctx" "$secs" "$bin/puredrive_device" bench --synth qwen3.5-35b-a3b --quant "$q" \
    --contexts "$ctx" --tokens "$tokens" --profile-steps 3 --prefill-chunk "${PD_PREFILL_CHUNK:-0}" \
    --fill "${PD_FILL:-auto}" ${mtp_args[@]+"${mtp_args[@]}"} --json "$out/bench_$q.json" --markdown "$out/bench_$q.md" \
    --commit "$commit" --note "$dirty"
  [ -f "$out/bench_$q.json" ] && python3 - "$out/bench_$q.json" >>"$summary" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
if not j.get("complete"):
    print(f"  {j['model']['quant']}: INCOMPLETE, {len(j['cells'])} cell(s) finished")
bw = j["copy_bandwidth_bytes_per_second"] / 1e9
for key in ("row_exact_check", "row_exact_check_long"):
    rx = j.get(key)
    if rx:
        print(f"  {j['model']['quant']}: row-exact check at real dims ({rx['rows']} rows vs one-row steps after "
              f"{rx['prompt_tokens']} tokens): logits {rx['logits_equal']}, KV {rx['kv_equal']}, "
              f"GDN state {rx['gdn_state_equal']} -> {'PASS' if rx['pass'] else 'FAIL'}")
for c in j["cells"]:
    g = c.get("cuda_graphs") or {}
    pf = c.get("prefill_tokens_per_second")
    fill = f"prefill {pf:.0f} tok/s" if pf is not None else f"synthetic fill {c.get('fill_seconds', 0):.1f} s"
    at = c.get("decode_attention") or {}
    attn = (f"attention {at['kv_bytes_per_step']/1e9:.2f} GB/step in {at['ms_per_step']:.3f} ms = "
            f"{at['bandwidth_bytes_per_second']/1e9:.0f} GB/s ({100*at['share_of_profiled_step']:.0f}% of the step)"
            if "ms_per_step" in at else "attention -")
    print(f"  {j['model']['quant']:>4} ctx {c['context']:>6}: decode {c['decode_tokens_per_second']:7.1f} tok/s, "
          f"floor {c['floor_tokens_per_second']:7.1f} ({100*c['fraction_of_floor']:4.1f}%), "
          f"step {c['step_ms_median']:.3f} ms, verify R={c['verify']['rows']}/R=1 {c['verify']['ratio']:.2f}, "
          f"{fill}, {attn}, nodes/step {g.get('nodes_in_decode_graph','-')}, "
          f"host {g.get('host_record_ms_per_step', 0):.3f} ms + gpu {g.get('graph_gpu_ms_per_step', 0):.3f} ms/step, "
          f"copy bw {bw:.0f} GB/s")
    for t in (c.get("op_profile") or [])[:8]:
        print(f"      {t['op']:<36} {t['ms_per_step']:8.3f} ms/step {100*t['share']:5.1f}%  ({t['calls_per_step']:.0f} calls)")
    m = c.get("mtp_cycle")
    if m:
        sp, g, fl = m["split_ms_per_cycle"], m.get("cuda_graphs") or {}, m["floor"]
        print(f"    MTP K={m['draft_tokens']} ({m['tokens_per_cycle']:.2f} tok/cycle scripted): cycle {m['cycle_ms']:.3f} ms "
              f"= {m['cycle_over_plain_step']:.2f}x the plain step {m['plain_step_ms']:.3f} ms; "
              f"{m['effective_tokens_per_second']:.1f} tok/s = {m['speedup_over_plain']:.2f}x plain {m['plain_tokens_per_second']:.1f}; "
              f"floor {fl['tokens_per_second']:.1f} tok/s ({100*m['fraction_of_floor']:.1f}%, {fl['bytes_per_cycle']/1e9:.2f} GB/cycle, "
              f"{fl['experts_per_cycle']:.0f} experts); split draft {sp['draft']:.3f} / verify {sp['verify']:.3f} / sample "
              f"{sp['sample']:.3f} ms; host waits/cycle {g.get('host_waits_per_cycle', '-')}, graph replays/cycle "
              f"{g.get('graph_replays_per_cycle', '-')}, eager {g.get('eager_steps_in_timed_cycles', '-')}; "
              f"identity {'ok' if m['output_equals_plain'] and m['acceptance_as_scripted'] else 'FAIL'}")
PY
}
# Kernel-level profile of one eager decode step (the bench marks it with an NVTX range): device time and
# DRAM bytes of every kernel, grouped by kernel; PD_NCU_QUANTS lists the weight formats (default none).
ncu_step() {
  local q=$1
  local ncu_bin
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu_bin" ] || { row "ncu $q" "SKIPPED (no ncu)"; return; }
  run_phase "ncu $q decode step" "${PD_NCU_S:-120}" "$ncu_bin" --clock-control none --cache-control none --nvtx \
    --nvtx-include "pd_decode_step/" --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base --log-file "$out/ncu_$q.csv" "$bin/puredrive_device" bench --synth qwen3.5-35b-a3b \
    --quant "$q" --contexts 2k --tokens 4 --verify-iters 1 --profile-steps 1 --prefill-chunk 0
  [ -f "$out/ncu_$q.csv" ] && python3 - "$out/ncu_$q.csv" "$q" >>"$summary" <<'PY'
import csv, re, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
ix = {k: i for i, k in enumerate(head)}
per = collections.defaultdict(lambda: [0, 0.0, 0.0])
launches = set()
for r in data:
    name = re.sub(r'\(.*', '', r[ix["Kernel Name"]])
    name = re.sub(r'^.*::', '', re.sub(r'<.*', '', name))
    key = (r[ix["ID"]], name)
    v = float(r[ix["Metric Value"]].replace(',', ''))
    m = r[ix["Metric Name"]]
    if key not in launches:
        launches.add(key)
        per[name][0] += 1
    if m == "gpu__time_duration.sum":
        per[name][1] += v * 1e-9
    else:
        per[name][2] += v
tt = sum(p[1] for p in per.values()); tb = sum(p[2] for p in per.values())
print(f"  ncu {sys.argv[2]}: {len(launches)} kernels, {tt*1e3:.3f} ms device time, {tb/1e9:.2f} GB DRAM, {tb/tt/1e12:.2f} TB/s")
for name, (n, t, b) in sorted(per.items(), key=lambda kv: -kv[1][1])[:14]:
    print(f"      {name:<34} {n:4d} x {t/n*1e6:7.1f} us = {t*1e3:6.3f} ms  {b/t/1e12 if t else 0:5.2f} TB/s")
PY
}
for q in ${PD_NCU_QUANTS:-}; do ncu_step "$q"; done

quants=${PD_QUANTS:-bf16 q8 q6}
first_q=${quants%% *}
bench "$first_q" "${PD_FIRST_BENCH_S:-120}" "$contexts"

if [ "${PD_SKIP_SANITIZER:-0}" != 1 ]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  export PD_CUDA_TEST_QUICK=1
  run_phase "memcheck cuda_ops_tests (quick)" 110 "$cs" --tool memcheck --error-exitcode 9 "$bin/cuda_ops_tests"
  # Racecheck is slow on big grids: the smallest attention and MoE cases only (PD_CUDA_TEST_SMALL), each in its
  # own slot; the matmul case covers the tiled prefill kernel (R = 11).
  export PD_CUDA_TEST_SMALL=1
  run_phase "racecheck attention (small)" "${PD_RACECHECK_S:-60}" "$cs" --tool racecheck --error-exitcode 9 \
    "$bin/cuda_ops_tests" --gtest_filter='CudaAttention.*'
  run_phase "racecheck MoE + matmul (small)" "${PD_RACECHECK_S:-60}" "$cs" --tool racecheck --error-exitcode 9 \
    "$bin/cuda_ops_tests" --gtest_filter='CudaOps.MoeMatchesCpuAndIsRowExact:CudaOps.MatmulEveryFormatRowExact'
  run_phase "racecheck GDN prefill (small)" "${PD_RACECHECK_S:-60}" "$cs" --tool racecheck --error-exitcode 9 \
    "$bin/cuda_ops_tests" --gtest_filter='CudaGdnPrefill.MatchesCpuRecurrenceAndChunkedForm'
  unset PD_CUDA_TEST_SMALL
  # The sample op: shared-memory races in its selection and scans, out-of-bounds accesses.
  run_phase "racecheck sampling (quick)" 60 "$cs" --tool racecheck --error-exitcode 9 "$bin/cuda_sampling_tests" \
    --gtest_filter='CudaSample.MixedCasesSmallVocabularies:CudaSample.DeepSelection'
  run_phase "memcheck sampling (quick)" 60 "$cs" --tool memcheck --error-exitcode 9 "$bin/cuda_sampling_tests" \
    --gtest_filter='CudaSample.MixedCases*'
  run_phase "memcheck model subset (quick)" 60 "$cs" --tool memcheck --error-exitcode 9 "$bin/cuda_model_tests" \
    --gtest_filter='*MatchesCpu/qwen3next_f32:*MtpRows*/qwen35_mlx_q:*Repeated*/qwen35_bf16'
  unset PD_CUDA_TEST_QUICK
fi
# puredrive check (row exactness, greedy/seeded identity MTP on == off for K = 1..4, chi-square where the
# vocabulary is small) on the CUDA backend for every fixture with a reference and for models/tiny-coder;
# only when the bundle has the full CLI (PD_WITH_CHECK=1 bench/device/prepare.sh). The time left (less
# PD_RESERVE_S for the other quants' benches) is shared among the models, at most PD_CHECK_S each.
if [ -x "$bin/puredrive_check" ] && [ "${PD_SKIP_CHECK:-0}" != 1 ]; then
  models=()
  for d in tests/fixtures/*/ models/tiny-coder/; do
    d=${d%/}
    [ -f "$d/config.json" ] || continue
    [ "$d" = tests/fixtures/tiny-coder ] && continue  # the same checkpoint as models/tiny-coder
    case "$d" in models/*) ;; *) [ -f "$d/reference.json" ] || continue ;; esac
    models+=("$d")
  done
  i=0
  for d in "${models[@]}"; do
    share=$(((($(left) - ${PD_RESERVE_S:-0})) / (${#models[@]} - i)))
    [ "$share" -gt "${PD_CHECK_S:-60}" ] && share=${PD_CHECK_S:-60}
    [ "$share" -lt 20 ] && share=20
    run_phase "check --backend cuda $d" "$share" "$bin/puredrive_check" check --model "$d" --backend cuda
    i=$((i + 1))
  done
  # Affine prefill products on mma.sync (wgmma by default on Hopper) as well.
  run_phase "check --backend cuda (mma.sync affine prefill) qwen35-mlx-q" 30 env PD_AFFINE_TMA=0 \
    "$bin/puredrive_check" check --model tests/fixtures/qwen35-mlx-q --backend cuda
fi

for q in ${quants#"$first_q"}; do bench "$q" "${PD_OTHER_BENCH_S:-100}" "${PD_OTHER_CONTEXTS:-$contexts}"; done
disk_models

echo
echo "== summary ($(($(date +%s) - start)) s; full log: run.log)"
cat "$summary"
