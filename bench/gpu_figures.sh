#!/usr/bin/env bash
# The WGSL runtime's GPU figures in one go (issue 4): the adapter, WGSL matmul against torch's fp32 matmul on CUDA
# per tile configuration, GPT training tokens/s of tinyllm-wgsl (eager and through tinyllm.jit) beside torch on CUDA,
# then the WGSL tests on the GPU.
#
#   bash bench/gpu_figures.sh            # from the repository root; the log goes to $OUT/log (else ./gpu_figures.log)
#
# For a bare machine without a package registry: wheels in .whl/ (wgpu and its needs) are installed into /tmp/site,
# and Vulkan loader packages in .gl/ (*.deb) are unpacked into / first, when those folders exist. Each step has its own
# time limit, so a hang costs one step, not the run.
set -o pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:+$OUT/log}
LOG=${LOG:-gpu_figures.log}
export PYTHONUNBUFFERED=1

step() {  # step SECONDS NAME COMMAND...: one step under its own time limit, its exit status reported
  local limit=$1 name=$2
  shift 2
  echo; echo "=== $name ($(date -u +%H:%M:%S) UTC, limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@"
  echo "=== $name: exit $? after $((SECONDS - start)) s"
}

main() {
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S') UTC; commit $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
if [ -d .gl ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
python3 -c "import sys, torch, numpy, wgpu; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.cuda.is_available(), 'numpy', numpy.__version__, 'wgpu', wgpu.__version__)"

probe() {
  timeout 30 python3 -c "
import wgpu
for a in wgpu.gpu.enumerate_adapters_sync():
    print('adapter:', a.summary)"
  timeout 60 python3 -c "
import tinyllm as tl
rt = tl.runtime.get('wgsl')
print('tinyllm wgsl:', rt.info, {k: rt.gpu.limits[k] for k in ('max-compute-invocations-per-workgroup',
      'max-compute-workgroup-storage-size', 'max-storage-buffer-binding-size')})
print('matmul tiles at 4096:', rt.matmul_tiles(4096, 4096))" 2>&1 | tee /tmp/probe.txt
  grep -q "tinyllm wgsl:.*NVIDIA" /tmp/probe.txt
}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TINYLLM_WGPU_ADAPTER=NVIDIA TINYLLM_WGPU_BACKEND=vulkan
if ! probe; then
  echo "no NVIDIA adapter through the default Vulkan driver list: trying the driver's own ICD file"
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
    __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  probe || { echo "no NVIDIA adapter for wgpu: stopping"; return 1; }
fi

step 150 matmul python3 bench/matmul.py --threads 1 --sizes --trans-n 0 --rounds 3 --wgsl-sizes 1024 2048 4096 \
  --wgsl-tiles auto 128x128x16x8x8 64x64x16x4x4
step 200 train_gpt python3 bench/train_gpt.py --configs S M --threads 1 --runtimes wgsl wgsl+jit --torch-device cuda
step 80 wgsl_tests python3 -m pytest -q -x -p no:cacheprovider tests/test_wgsl_runtime.py tests/test_wgsl_rowwise.py \
  "tests/test_jit.py::test_replayed_training_equals_eager_and_tracks_torch[wgsl]"
echo "done $(date -u +%H:%M:%S) UTC"
}
main 2>&1 | tee "$LOG"
