#!/usr/bin/env bash
# Builds Headway and runs its test suite, as CI does: installs what is
# missing (deploy/setup.sh), builds into build/, then runs every test except
# those labelled `slow`. HEADWAY_REQUIRE_MODEL=1 turns a missing model into a
# failure instead of a skip.
#
# Usage: bash deploy/test.sh [--fuzz] [extra ctest arguments, e.g. -L unit or -R Config]
#   --fuzz  also build the libFuzzer targets with clang into build-fuzz/
#           (HEADWAY_FUZZ_BUILD_DIR) and fuzz each for a bounded time
#           (README "Fuzzing"; ctest -L fuzz-short there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RUN_FUZZ=0
ctest_args=()
for arg in "$@"; do
  if [[ "$arg" == "--fuzz" ]]; then RUN_FUZZ=1; else ctest_args+=("$arg"); fi
done
set -- "${ctest_args[@]+"${ctest_args[@]}"}"

BUILD_DIR="${HEADWAY_BUILD_DIR:-build}"

bash deploy/setup.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$(nproc)"

export HEADWAY_REQUIRE_MODEL=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -LE slow -j2 "$@"

# ---- fuzzing (--fuzz): a separate clang build, every library instrumented
# for libFuzzer with ASan/UBSan; each target fuzzes HEADWAY_FUZZ_SHORT_S
# seconds (CMake cache, default 15) from its seed corpus and regressions.
if ((RUN_FUZZ)); then
  FUZZ_DIR="${HEADWAY_FUZZ_BUILD_DIR:-build-fuzz}"
  cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADWAY_FUZZ=ON \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DHEADWAY_DISABLE_CUDA=ON
  cmake --build "$FUZZ_DIR" -j"$(nproc)"
  ctest --test-dir "$FUZZ_DIR" --output-on-failure -L fuzz-short
fi
