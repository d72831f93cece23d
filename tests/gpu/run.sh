#!/usr/bin/env bash
# The one-shot GPU check. On a machine with a GPU, runs the CUDA kernel
# tests, the GPU worker tests and the CUDA micro-benchmarks, and prints one
# JSON object (also written to $OUT/gpu_check.json when OUT is set):
#   tests:      every test_gpu case run: passed / failed / skipped, and the
#               figures each recorded (max errors against the references)
#   attention:  headway-cuda-attention-bench (decode bandwidth at 1K/8K/32K
#               context against the copy bandwidth measured in the same run;
#               prefill TFLOP/s)
#   matmul:     headway-cuda-matmul-bench (GEMM TFLOP/s against cuBLAS's own;
#               dequantising GEMV against bf16 GEMM at decode sizes)
#
#   bash tests/gpu/run.sh [all|kernels|model]     # default: all
# kernels: everything but the tests that need the SmolLM2 model, plus the
# benchmarks; model: only those tests (CudaModelTest, CudaServingTest).
#
# Binaries: from .gpu-bundle.tar.xz (or .gpu-bundle/) when present, made on
# a build machine by tests/gpu/bundle.sh for GPU machines without Debian's
# libraries, unpacked once into /tmp/headway-gpu; else built here into
# build-gpu/ (needs the libraries deploy/setup.sh installs).
# The model is looked up in $HEADWAY_MODEL_DIR (default /tmp/headway-gpu/models),
# after joining every part found in .gpu-model/ and /tmp/headway-gpu/parts/
# (bundle.sh splits it, since a remote call may carry at most 64 MiB). Over
# two such calls: the first carries .gpu-bundle.tar.xz and .gpu-model/part-aa
# and runs `bash tests/gpu/run.sh kernels` (which keeps part-aa in
# /tmp/headway-gpu/parts/ for the next call on the same machine); the second
# carries .gpu-model/part-ab and runs `bash tests/gpu/run.sh model`.
#
# Runs in under 8 minutes on an H200 (each step has its own time limit).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MODE="${1:-all}"
RESULTS="${OUT:-/tmp/headway-gpu/results}"
WORK=/tmp/headway-gpu
mkdir -p "$RESULTS" "$WORK/parts"
export HEADWAY_MODEL_DIR="${HEADWAY_MODEL_DIR:-$WORK/models}"
mkdir -p "$HEADWAY_MODEL_DIR"
MODEL="$HEADWAY_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
if compgen -G ".gpu-model/part-*" >/dev/null; then cp .gpu-model/part-* "$WORK/parts/"; fi
if [[ ! -f "$MODEL" ]] && [[ -f "$WORK/parts/part-aa" && -f "$WORK/parts/part-ab" ]]; then
  cat "$WORK/parts"/part-* > "$MODEL"
fi

if [[ -f .gpu-bundle.tar.xz && ! -x "$WORK/.gpu-bundle/bin/test_gpu" ]]; then
  tar -xJf .gpu-bundle.tar.xz -C "$WORK"
elif [[ -x .gpu-bundle/bin/test_gpu && ! -x "$WORK/.gpu-bundle/bin/test_gpu" ]]; then
  cp -r .gpu-bundle "$WORK/"
fi
if [[ -x "$WORK/.gpu-bundle/bin/test_gpu" ]]; then
  BIN="$WORK/.gpu-bundle/bin"
  # NCCL and cuBLAS may come with the CUDA toolkit or as NVIDIA's Python wheels.
  wheel_lib() {
    python3 -c "import os, $1 as m; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null
  }
  export LD_LIBRARY_PATH="$WORK/.gpu-bundle/lib:/usr/local/cuda/lib64:$(wheel_lib nvidia.nccl):$(wheel_lib nvidia.cublas):${LD_LIBRARY_PATH:-}"
else
  BIN="$PWD/build-gpu/bin"
  timeout 420 bash -c 'cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target test_gpu headway-cuda-attention-bench \
      headway-cuda-matmul-bench headway-launch headway-coordinator headway-worker' \
    > "$RESULTS/build.log" 2>&1 || tail -30 "$RESULTS/build.log"
fi
nvidia-smi -L > "$RESULTS/nvidia-smi.txt" 2>&1 || true

export HEADWAY_TEST_DATA_DIR="$PWD/tests/data" HEADWAY_SOURCE_DIR="$PWD" HEADWAY_BIN_DIR="$BIN"
case "$MODE" in
  kernels) filter='-CudaModelTest.*:CudaServingTest.*' ;;
  model) filter='CudaModelTest.*:CudaServingTest.*' ;;
  *) filter='*' ;;
esac
timeout 300 "$BIN/test_gpu" --gtest_filter="$filter" --gtest_output="json:$RESULTS/tests.json" \
  > "$RESULTS/tests.log" 2>&1
echo "test_gpu exit $?" >> "$RESULTS/tests.log"
if [[ "$MODE" != model ]]; then
  timeout 90 "$BIN/headway-cuda-attention-bench" > "$RESULTS/attention.json" 2> "$RESULTS/attention.err"
  timeout 60 "$BIN/headway-cuda-matmul-bench" > "$RESULTS/matmul.json" 2> "$RESULTS/matmul.err"
fi
python3 tests/gpu/summarize.py "$RESULTS" | tee "$RESULTS/gpu_check.json"
