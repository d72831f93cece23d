#!/usr/bin/env bash
# The one-shot GPU check. On a machine with a GPU, runs the CUDA kernel
# tests, the GPU worker tests and the CUDA micro-benchmarks, and prints one
# JSON object (also written to $OUT/gpu_check.json, or to
# /tmp/headway-gpu/results/ when OUT is unset):
#   counts, tests:  every test_gpu case run: passed / failed / skipped (with
#                   the reason), and the figures each recorded (max errors
#                   against the references)
#   measured:       the "[ measured ]" lines tests printed (GPU vs CPU logits)
#   attention:      headway-cuda-attention-bench (decode bandwidth at 1K/8K/32K
#                   context for each KV cache dtype, against the copy bandwidth
#                   and float32 measured in the same run; prefill TFLOP/s)
#   matmul:         headway-cuda-matmul-bench (GEMM TFLOP/s against cuBLAS's
#                   own; dequantising GEMV against bf16 GEMM at decode sizes)
# Exit status 0 only when no test failed (skips are not failures; on a
# one-GPU machine CudaWorkerSetupTest.NoGpuGivesClearErrors and the
# two-GPU tests skip), else 1.
#
#   bash tests/gpu/run.sh [all|kernels|model]     # default: all
# kernels: every test but those needing the SmolLM2 model, plus the two
# benchmarks (limits: 300 s of tests, 150 s of benchmarks; expected: about
# a minute). model: only CudaModelTest and CudaServingTest (limit 300 s;
# expected: about a minute). all: both.
#
# Binaries: from .gpu-bundle.tar.xz when present (made on a build machine by
# tests/gpu/bundle.sh, for GPU machines without Debian's libraries),
# unpacked into /tmp/headway-gpu; else built here into build-gpu/ (needs the
# libraries deploy/setup.sh installs).
#
# The model: $HEADWAY_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf (default dir
# /tmp/headway-gpu/models), else joined from parts bundle.sh made
# (.gpu-model/part-aa, 40 MiB, and part-ab, 54 MiB), since a call to a remote
# GPU machine carries at most 64 MiB. Two calls, the second straight after
# the first, on the same warm machine:
#   1. carry .gpu-bundle.tar.xz and .gpu-model/part-aa;
#      run `bash tests/gpu/run.sh kernels` (it keeps the unpacked bundle and
#      part-aa in /tmp/headway-gpu for the next call)
#   2. carry .gpu-model/part-ab; run `bash tests/gpu/run.sh model`
# If the machine was recycled in between, call 2 stops at once saying so:
# repeat call 1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MODE="${1:-all}"
case "$MODE" in all|kernels|model) ;; *) echo "usage: $0 [all|kernels|model]" >&2; exit 2 ;; esac
WORK=/tmp/headway-gpu
RESULTS="${OUT:-$WORK/results}"
mkdir -p "$RESULTS" "$WORK/parts"
rm -f "$RESULTS"/{tests.json,tests.log,attention.json,matmul.json,gpu_check.json}

# The model, joined from its parts when needed and checked by size.
export HEADWAY_MODEL_DIR="${HEADWAY_MODEL_DIR:-$WORK/models}"
mkdir -p "$HEADWAY_MODEL_DIR"
MODEL="$HEADWAY_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_BYTES=98362432
for part in aa ab; do
  if [[ -f .gpu-model/part-$part ]]; then cp .gpu-model/part-$part "$WORK/parts/"; fi
done
if [[ $(stat -c %s "$MODEL" 2>/dev/null || echo 0) != "$MODEL_BYTES" ]] &&
   [[ -f "$WORK/parts/part-aa" && -f "$WORK/parts/part-ab" ]]; then
  cat "$WORK/parts/part-aa" "$WORK/parts/part-ab" > "$MODEL"
fi
have_model=0
[[ $(stat -c %s "$MODEL" 2>/dev/null || echo 0) == "$MODEL_BYTES" ]] && have_model=1

# The binaries.
if [[ -f .gpu-bundle.tar.xz ]] &&
   [[ ! -x "$WORK/.gpu-bundle/bin/test_gpu" || .gpu-bundle.tar.xz -nt "$WORK/.gpu-bundle.stamp" ]]; then
  rm -rf "$WORK/.gpu-bundle"
  tar -xJf .gpu-bundle.tar.xz -C "$WORK" && touch "$WORK/.gpu-bundle.stamp"
fi
if [[ "$MODE" == model ]]; then
  missing=""
  [[ -x "$WORK/.gpu-bundle/bin/test_gpu" || -x build-gpu/bin/test_gpu ]] || missing="the binaries"
  [[ $have_model == 1 ]] || missing="${missing:+$missing and }the model (part-aa and part-ab, or $MODEL)"
  if [[ -n "$missing" ]]; then
    echo "run.sh model: missing $missing: this machine does not hold what call 1 left" \
         "(recycled in between?); repeat call 1, then this one straight after" >&2
    exit 1
  fi
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
# A model test that cannot find the model fails instead of skipping.
[[ "$MODE" != kernels ]] && export HEADWAY_REQUIRE_MODEL=1
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
python3 tests/gpu/summarize.py "$RESULTS" > "$RESULTS/gpu_check.json"
status=$?
cat "$RESULTS/gpu_check.json"
exit $status
