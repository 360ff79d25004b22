# Checkpoints on disk at full scale (issue 16), sourced by bench/device/run.sh, which defines run_phase, row,
# note, left, $bin, $bundle, $out, $log, $summary. For every recipe in PD_DISK_MODELS (e.g. "q8 oq6e"; bf16
# needs about 72 GB of disk): `synth --write` the synthetic Qwen3.5-35B-A3B checkpoint (PD_DISK_ARCH) to local
# disk (PD_DISK_DIR, default /tmp/pd-disk) with the Qwen tokenizer and the Qwen3.5 chat template, read its
# weights through the upload reader (`bench --read-weights`), run `bench --model` (PD_DISK_CONTEXTS, default
# 2k; greedy and greedy-mtp, PD_DISK_RUNS runs of PD_DISK_TOKENS tokens), serve it and drive it with the
# OpenAI client (bench/api_bench.py, MTP draft 0 and 2), and `bench --synth` on the same weights; then delete
# the checkpoint (one at a time: q8 and oq6e together pass the machine's 64 GB). Records go to $OUT:
# synth_write_Q.json, read_Q.json, bench_model_Q.json, api_Q.json, bench_synth_Q.json, and a comparison in the
# summary. Needs the full CLI and the openai client in the bundle: PD_WITH_SERVE=1 PD_WITH_API=1
# bench/device/prepare.sh. PD_DISK_S caps each phase (default 420 s).
# PD_DISK_CONVERT=RECIPE (issue 18): the bf16 checkpoint written to memory (PD_CONVERT_DIR, default /dev/shm,
# whose size is raised to PD_CONVERT_SHM_GB, default 110, when it has less room, or else a tmpfs of that size
# mounted at $PD_DISK_DIR-tmpfs: 72 GB of bf16 do not fit the disk next to the output), converted by
# `puredrive quantize --recipe RECIPE` on all cores to disk (convert_RECIPE.txt; its last line, copied to the
# summary, holds the time, the byte counts and the peak resident memory), the bf16 deleted, and the converted
# checkpoint measured like the others (label conv-RECIPE). tests/synth/disk_convert_cpu.sh runs this path on
# the tiny architecture. PD_DISK_PREFIX_REPLAY="q8 ...": bench/agent_replay.py (prefix cache on and off, turn 10's
# TTFT at most 10% of cold) against those checkpoints too.

# Free GB in the file system holding $1.
free_gb() { df -Pk "$1" | awk 'NR == 2 {print int($4 / 1048576)}'; }

# Writes the bf16 checkpoint to memory and quantizes it into $2 with recipe $1. Uses $arch, $full, $disk,
# $secs of disk_models.
convert_checkpoint() {
  local recipe=$1 dst=$2 shm=${PD_CONVERT_DIR:-/dev/shm} want=${PD_CONVERT_SHM_GB:-110}
  local need_gb=75 out_gb=32 mounted="" src
  [ "$arch" = qwen3.5-35b-a3b ] || { need_gb=1; out_gb=1; }
  rm -rf "$shm/pd-convert-bf16"
  if [ "$(free_gb "$shm")" -lt "$need_gb" ] && [ "$shm" = /dev/shm ]; then
    # /dev/shm is sized at boot (half the memory then, or a container's 64 MB); as root it can be resized, or a
    # tmpfs of our own mounted beside it.
    mount -o remount,size="${want}G" /dev/shm 2>>"$log" || note "could not resize /dev/shm"
    if [ "$(free_gb "$shm")" -lt "$need_gb" ]; then
      mkdir -p "$disk-tmpfs"
      if mount -t tmpfs -o size="${want}G" pd-convert "$disk-tmpfs" 2>>"$log"; then
        shm=$disk-tmpfs mounted=$disk-tmpfs
      else
        note "could not mount a tmpfs at $disk-tmpfs"
        rmdir "$disk-tmpfs"
      fi
    fi
  fi
  src=$shm/pd-convert-bf16
  if [ "$(free_gb "$shm")" -lt "$need_gb" ]; then
    row "convert bf16 -> $recipe" "SKIPPED ($shm has $(free_gb "$shm") GB free, the bf16 checkpoint needs $need_gb)"
  elif [ "$(free_gb "$(dirname "$dst")")" -lt "$out_gb" ]; then
    row "convert bf16 -> $recipe" "SKIPPED ($(free_gb "$(dirname "$dst")") GB free for the output, $out_gb needed)"
  else
    run_phase "synth --write $arch bf16 (memory)" "$secs" sh -c "\"$full\" synth --arch $arch --quant bf16 \
      --write \"$src\" --tokenizer \"$disk/tokenizer\" --chat-template tests/data/templates/Qwen3.5-4B.jinja \
      --json -q >\"$out/synth_write_bf16.json\""
    python3 - "$out/synth_write_bf16.json" >>"$summary" 2>/dev/null <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))
print(f"  bf16 to memory: written {w['bytes'] / 1e9:.1f} GB in {w['seconds']:.1f} s "
      f"({w['bytes'] / 1e9 / w['seconds']:.2f} GB/s), peak RSS {w['peak_rss_bytes'] / 1e9:.2f} GB")
PY
    if [ -f "$src/config.json" ]; then
      # The last line holds the time, the byte counts and the peak resident memory.
      run_phase "quantize bf16 -> $recipe" "$secs" sh -c "\"$full\" quantize --model \"$src\" --out \"$dst\" \
        --recipe $recipe >\"$out/convert_$recipe.txt\" 2>&1"
      tail -3 "$out/convert_$recipe.txt" 2>/dev/null | sed 's/^/  /' >>"$summary"
    fi
  fi
  rm -rf "$src"
  [ -n "$mounted" ] && { umount "$mounted" 2>>"$log" || note "could not unmount $mounted"; }
  grep -q "the output loads" "$out/convert_$recipe.txt" 2>/dev/null && [ -f "$dst/config.json" ]
}

disk_models() {
  [ -n "${PD_DISK_MODELS:-}${PD_DISK_CONVERT:-}" ] || return 0
  local full=$bin/puredrive arch=${PD_DISK_ARCH:-qwen3.5-35b-a3b} disk=${PD_DISK_DIR:-/tmp/pd-disk}
  local secs=${PD_DISK_S:-420} ctxs=${PD_DISK_CONTEXTS:-2k} ntok=${PD_DISK_TOKENS:-512} runs=${PD_DISK_RUNS:-3}
  local commit dirty
  commit=$(awk '/^commit/ {print $2}' "$bundle/build_info.txt")
  dirty=$(sed -n 2p "$bundle/build_info.txt")
  if [ ! -x "$full" ]; then
    row "disk models" "SKIPPED (no bin/puredrive: PD_WITH_SERVE=1 bench/device/prepare.sh)"
    return 0
  fi
  mkdir -p "$disk/tokenizer"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    tests/data/qwen3/tokenizer.json.tar.xz "$disk/tokenizer"
  cp tests/data/qwen3/tokenizer_config.json "$disk/tokenizer/"
  # The openai client, carried as wheels by prepare.sh (the GPU machine has no network).
  local pypath=$disk/site
  if ls "$bundle"/wheels/openai-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$pypath" \
      "$bundle"/wheels/*.whl >>"$log" 2>&1 || note "installing the openai wheels failed"
  fi
  for q in ${PD_DISK_MODELS:-} ${PD_DISK_CONVERT:+conv-$PD_DISK_CONVERT}; do
    local dir=$disk/$arch-$q
    rm -rf "$dir"
    if [ "${q#conv-}" != "$q" ]; then
      convert_checkpoint "${q#conv-}" "$dir" || continue
    else
      local need_gb have_gb
      case "$q" in bf16) need_gb=72 ;; q8) need_gb=39 ;; *) need_gb=32 ;; esac
      [ "$arch" = qwen3.5-35b-a3b ] || need_gb=1
      have_gb=$(free_gb "$disk")
      if [ "$have_gb" -lt "$need_gb" ]; then
        row "disk $q" "SKIPPED ($need_gb GB needed, $have_gb GB free in $disk)"
        continue
      fi
      run_phase "synth --write $arch $q" "$secs" sh -c "\"$full\" synth --arch $arch --quant $q --write \"$dir\" \
        --tokenizer \"$disk/tokenizer\" --chat-template tests/data/templates/Qwen3.5-4B.jinja --json -q \
        >\"$out/synth_write_$q.json\""
    fi
    [ -f "$dir/config.json" ] || continue
    # Twice through the upload's reader: disk (or the page cache the write left), then the page cache.
    run_phase "read weights $q" "$secs" "$full" bench --model "$dir" --read-weights --json "$out/read_$q.json"
    run_phase "bench --model $q" "$secs" "$full" bench --model "$dir" --contexts "$ctxs" --tokens "$ntok" \
      --runs "$runs" --modes greedy,greedy-mtp --json "$out/bench_model_$q.json" --commit "$commit" --note "$dirty"
    if [ -d "$pypath/openai" ]; then
      run_phase "api_bench $q" "$secs" env PYTHONPATH="$pypath" python3 bench/api_bench.py --bin "$full" \
        --model "$dir" --contexts "$ctxs" --tokens "$ntok" --runs "$runs" --mtp-drafts 0,2 \
        --json "$out/api_$q.json" --commit "$commit" --note "$dirty"
    else
      row "api_bench $q" "SKIPPED (no openai client: PD_WITH_API=1 bench/device/prepare.sh)"
    fi
    if [[ " ${PD_DISK_PREFIX_REPLAY:-} " == *" $q "* ]]; then
      run_phase "agent replay (prefix cache) $q" "$secs" python3 bench/agent_replay.py --bin "$full" \
        --model "$dir" --serve-args "--backend cuda" --max-ttft-ratio 0.1 --check --out "$out/replay_$q.md"
      tail -16 "$out/replay_$q.md" 2>/dev/null | sed 's/^/  /' >>"$summary"
    fi
    run_phase "bench --synth $q (same weights)" "$secs" "$bin/puredrive_device" bench --synth "$arch" --quant "${q#conv-}" \
      --contexts "$ctxs" --tokens "$ntok" --prefill-chunk 64 --json "$out/bench_synth_$q.json" --commit "$commit" \
      --note "$dirty"
    rm -rf "$dir"
    python3 - "$out" "$q" >>"$summary" <<'PY'
import json, os, sys
out, q = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(out, f"{name}_{q}.json")
    return json.load(open(p)) if os.path.exists(p) else None
w, r, b, a, s = (load(n) for n in ("synth_write", "read", "bench_model", "api", "bench_synth"))
if w:
    print(f"  {q}: written {w['bytes'] / 1e9:.1f} GB in {w['seconds']:.1f} s "
          f"({w['bytes'] / 1e9 / w['seconds']:.2f} GB/s), peak RSS {w['peak_rss_bytes'] / 1e9:.2f} GB")
if r:
    p = r["passes"]
    print(f"  {q}: upload reader pread {p[0]['bytes_per_second'] / 1e9:.1f} then {p[1]['bytes_per_second'] / 1e9:.1f}"
          f" GB/s, mmap {p[2]['bytes_per_second'] / 1e9:.1f} GB/s, peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")
ref = {}
if b:
    ld = b["model"]["load"]
    print(f"  {q}: bench --model load {ld['total_seconds']:.1f} s (upload {ld['upload_seconds']:.1f} s, "
          f"{(ld['upload_bytes_per_second'] or 0) / 1e9:.1f} GB/s); greedy identity "
          f"{b.get('greedy_mtp_identical')}")
    for x in b.get("summary", []):
        ref[(x["mode"], x["context"])] = x["decode_tokens_per_second_median"]
        print(f"  {q}: bench --model ctx {x['context']} {x['mode']:>10}: {x['decode_tokens_per_second_median']:.1f} "
              f"tok/s ({x['decode_tokens_per_second_min']:.1f}..{x['decode_tokens_per_second_max']:.1f})"
              + (f", {x['tokens_per_cycle_median']:.2f} tok/cycle" if "tokens_per_cycle_median" in x else ""))
if a:
    for srv in a["servers"]:
        print(f"  {q}: serve --mtp-draft {srv['mtp_draft']} listening after {srv['listen_seconds']:.1f} s "
              f"(model ready {srv.get('model_ready_seconds', '?')} s)")
    for x in a["summary"]:
        mode = "greedy" if x["mtp_draft"] == 0 else "greedy-mtp"
        base = ref.get((mode, x["context"]))
        rel = f", {100 * x['decode_tokens_per_second_median'] / base:.1f}% of bench --model" if base else ""
        print(f"  {q}: API k={x['mtp_draft']} ctx {x['context']}: {x['decode_tokens_per_second_median']:.1f} tok/s, "
              f"TTFT {x['ttft_seconds_median']:.3f} s{rel}")
if s:
    for c in s["cells"]:
        print(f"  {q}: bench --synth ctx {c['context']}: {c['decode_tokens_per_second']:.1f} tok/s")
PY
  done
}
