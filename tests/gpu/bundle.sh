#!/usr/bin/env bash
# Prepares the GPU check (tests/gpu/run.sh) for a GPU machine that has the
# CUDA toolkit but none of Debian's libraries: builds the binaries here (this
# machine needs the CUDA toolkit, not a GPU), gathers them with the shared libraries they need into
# .gpu-bundle/ and packs that into .gpu-bundle.tar.xz (about 13 MiB); splits
# the SmolLM2 GGUF into .gpu-model/part-aa and part-ab (40 MiB + 54 MiB), so
# that a machine reached by calls that carry at most 64 MiB each can get the
# model in two calls, the first with the bundle (run.sh's header says how).
#
#   bash tests/gpu/bundle.sh [build-dir]      # default: build
#
# Left out of the bundle on purpose (the GPU machine's CUDA installation
# provides them): the C library and loader, libstdc++/libgcc (any newer one
# runs these binaries), the CUDA driver, cudart, cuBLAS and NCCL.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD_DIR="${1:-build}"
OUT=.gpu-bundle
TARGETS=(test_gpu headway-cuda-attention-bench headway-cuda-matmul-bench headway-launch
         headway-coordinator headway-worker)

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${TARGETS[@]}"

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for t in "${TARGETS[@]}"; do
  strip --strip-debug -o "$OUT/bin/$t" "$BUILD_DIR/bin/$t"
done
skip='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
for t in "${TARGETS[@]}"; do
  ldd "$OUT/bin/$t" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ ! "$name" =~ $skip ]] && [[ ! -e "$OUT/lib/$name" ]]; then
      cp -L "$path" "$OUT/lib/$name"
      strip --strip-unneeded "$OUT/lib/$name" 2>/dev/null || true
    fi
  done
done
tar -cJf .gpu-bundle.tar.xz "$OUT"

model="${HEADWAY_MODEL_DIR:-$HOME/.cache/headway/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
rm -rf .gpu-model
if [[ ! -f "$model" ]]; then
  echo "bundle.sh: no model at $model (run deploy/setup.sh): .gpu-model/ not made" >&2
else
  mkdir -p .gpu-model
  head -c 40M "$model" > .gpu-model/part-aa
  tail -c +$((40 * 1024 * 1024 + 1)) "$model" > .gpu-model/part-ab
fi
du -sh .gpu-bundle.tar.xz .gpu-model/* 2>/dev/null
