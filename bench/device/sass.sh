#!/usr/bin/env bash
# The SASS of one CUDA source, without a GPU: compiles FILE for sm_90a as a cubin (the flags of the build)
# and prints each kernel's instruction count and its most frequent opcodes, or with --dump the whole
# listing. cuobjdump and nvdisasm come from NVIDIA's pinned PyPI wheels, installed once into build/sass-tools
# (the toolkit here ships neither). With --hazards, the wgmma register-operand check of a built library or
# cubin instead (wgmma_hazards.py; prepare.sh runs it on every device bundle). Usage:
#   bench/device/sass.sh src/puredrive/backend/cuda/gemm_tma.cu [KERNEL_REGEX] [--dump]
#   bench/device/sass.sh --hazards build/h9/lib/libpd_backend_cuda.so
set -euo pipefail
src=$1
pattern=${2:-.}
dump=${3:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
tools=$root/build/sass-tools
if [ ! -x "$tools/bin/python" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
fi
bin=$(dirname "$(find "$tools" -type f -name cuobjdump | head -1)")
chmod +x "$bin/cuobjdump" "$bin/nvdisasm"
export PATH=$bin:$PATH
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "$src" = --hazards ]; then
  cuobjdump -sass "$2" > "$out/k.sass"
  exec python3 "$root/bench/device/wgmma_hazards.py" "$out/k.sass"
fi
nvcc -std=c++20 -O3 --generate-code=arch=compute_90a,code=sm_90a -DPD_CUDA_SM90A=1 -I"$root/src" \
  --expt-relaxed-constexpr --fmad=false -cubin -o "$out/k.cubin" "$src"
cuobjdump -sass "$out/k.cubin" > "$out/k.sass"
if [ "$dump" = --dump ]; then
  cat "$out/k.sass"
  exit 0
fi
python3 - "$out/k.sass" "$pattern" <<'PY'
import collections, re, sys
text, pattern = open(sys.argv[1]).read(), sys.argv[2]
for body in re.split(r"\n\s*Function : ", text)[1:]:
    name = body.split("\n", 1)[0]
    if not re.search(pattern, name):
        continue
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", body)
    local = sum(op in ("LDL", "STL") for op in ops)
    top = " ".join(f"{k}:{v}" for k, v in collections.Counter(ops).most_common(12))
    print(f"{name}\n  {len(ops)} instructions, {local} local loads/stores; {top}")
PY
