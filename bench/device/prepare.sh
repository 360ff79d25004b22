#!/usr/bin/env bash
# Builds the CUDA binaries HERE (nvcc 13.0, sm_90a, Release, CUDA runtime linked statically) and stages them,
# with the non-system shared libraries they load, in build/device-bundle/ (ignored by git), because the GPU
# machine has none of our -dev packages and no network. Then, on the GPU machine (device tool):
#   run(command="bash bench/device/run.sh", carry=["build/device-bundle"], timeout_s=420)
# Environment: PD_DEVICE_BUILD (build directory, default build/h9), JOBS (parallel jobs, default 2),
# PD_WITH_CHECK=1 (bundle `puredrive check` too), PD_WITH_SERVE=1 (bundle the full CLI, `serve` included, for
# the disk models of run.sh), PD_WITH_API=1 (the pinned openai client and its dependencies as wheels from PyPI,
# about 6 MB, for the GPU machine's Python, PD_API_PYTHON, default 3.12: bench/api_bench.py there, where
# nothing can be downloaded).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${PD_DEVICE_BUILD:-$root/build/h9}
# PD_KERNEL_TRACE=1: kernels record a timeline (trace.cuh; bench/device/trace.sh), in a build directory of its own.
trace=OFF
if [ "${PD_KERNEL_TRACE:-0}" = 1 ]; then trace=ON; build=${PD_DEVICE_BUILD:-$root/build/h9t}; fi
bundle=$root/build/device-bundle
targets=(puredrive_device cuda_ops_tests cuda_model_tests cuda_sampling_tests cuda_upload_tests cuda_generator_tests
         cuda_prefix_cache_tests)
# PD_WITH_CHECK=1: also `puredrive check` (the puredrive_check binary, no server), for the fixtures (run.sh).
[ "${PD_WITH_CHECK:-0}" = 1 ] && targets+=(puredrive_check)
[ "${PD_WITH_SERVE:-0}" = 1 ] && targets+=(puredrive)

# PD_WERROR=OFF: GCC 12 at -O3 raises a false -Wrestrict in code outside the CUDA path (chat/jinja); the CUDA
# library keeps nvcc's -Werror=all-warnings.
# PD_CUDA_SHARED: the kernels live once in libpd_backend_cuda.so instead of in every binary (the bundle must
# fit the device tool's 64 MiB with the working tree). 90a-real: SASS for the H200 only, no PTX (which was
# most of the library's size); 90a: Hopper's wgmma and TMA (gemm_tma.cu).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DPD_WERROR=OFF -DPD_CUDA_SHARED=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DPD_KERNEL_TRACE=$trace >/dev/null
cmake --build "$build" --target "${targets[@]}" -j"${JOBS:-2}"
# No bundle whose SASS writes a register that a running wgmma still reads: the GPU would compute wrong values
# that vary from run to run (docs/DESIGN.md §8).
bash "$root/bench/device/sass.sh" --hazards "$(find "$build" -name libpd_backend_cuda.so | head -1)"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
cp "$build/bin/puredrive_device" "$bundle/bin/"
cp "$build/tests/cuda/cuda_ops_tests" "$build/tests/cuda/cuda_model_tests" "$build/tests/cuda/cuda_sampling_tests" "$build/tests/cuda/cuda_upload_tests" \
  "$build/tests/cuda/cuda_generator_tests" "$build/tests/cuda/cuda_prefix_cache_tests" "$bundle/bin/"
[ "${PD_WITH_CHECK:-0}" = 1 ] && cp "$build/bin/puredrive_check" "$bundle/bin/"
[ "${PD_WITH_SERVE:-0}" = 1 ] && cp "$build/bin/puredrive" "$bundle/bin/"
strip --strip-unneeded "$bundle"/bin/*

# Shared libraries outside the C/C++ runtime (the GPU machine's glibc and libstdc++ are newer than ours).
is_system() {
  case "$(basename "$1")" in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*) return 0 ;;
    libcuda.so.*|libnvidia*) return 0 ;;
  esac
  return 1
}
for b in "$bundle"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    is_system "$lib" || cp -Lu "$lib" "$bundle/lib/$(basename "$lib")"
  done
done
strip --strip-unneeded "$bundle"/lib/* 2>/dev/null || true

# The openai client at the server suite's pins, as wheels for the GPU machine's Python; run.sh installs them
# there into a scratch directory.
if [ "${PD_WITH_API:-0}" = 1 ]; then
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
    --python-version "${PD_API_PYTHON:-3.12}" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$bundle/wheels" -c "$root/tests/server/requirements.txt" openai
fi

# The test binaries find tests/fixtures under the source path compiled into them; run.sh links it there.
echo "$root" >"$bundle/source_dir"
{
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  if [ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ]; then
    echo "tree dirty: built from uncommitted changes ($(git -C "$root" status --porcelain | wc -l) paths)"
  else
    echo "tree clean"
  fi
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nvcc --version | tail -1)"
} >"$bundle/build_info.txt"
ls -la "$bundle/bin" "$bundle/lib"
du -sh "$bundle"
# The same compressed (the binaries share their kernels; ~10x smaller), for when the working tree plus the
# bundle would pass the device tool's 64 MiB: carry build/device-bundle.tar.xz instead, run.sh unpacks it.
tar -C "$root/build" -cJf "$root/build/device-bundle.tar.xz" device-bundle
ls -la "$root/build/device-bundle.tar.xz"
