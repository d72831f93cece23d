#!/usr/bin/env bash
# Builds Headway and runs its test suite, as CI does: installs what is
# missing (deploy/setup.sh), builds into build/, then runs every test except
# those labelled `slow`. HEADWAY_REQUIRE_MODEL=1 turns a missing model into a
# failure instead of a skip.
#
# --sanitize address: an AddressSanitizer + UndefinedBehaviorSanitizer build
#   in build-asan/, running the `unit` and `integration` tests (not `slow`).
# --sanitize thread: a ThreadSanitizer build in build-tsan/ of only what the
#   concurrency tests need, running those tests (TSAN_TESTS below).
# README "Tests" > "Sanitizers" says what these cost and how reports fail a test.
#
# --fuzz: also build the libFuzzer targets with clang into build-fuzz/
#   (HEADWAY_FUZZ_BUILD_DIR) and fuzz each for a bounded time (README
#   "Fuzzing"; ctest -L fuzz-short there).
#
# Usage: bash deploy/test.sh [--sanitize address|thread] [--fuzz] [extra ctest
#        arguments, e.g. -L unit or -R Config]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SANITIZE=""
RUN_FUZZ=0
ctest_args=()
while (($#)); do
  case "$1" in
    --sanitize) SANITIZE="${2:-}"; shift $(($# >= 2 ? 2 : 1)) ;;
    --sanitize=*) SANITIZE="${1#--sanitize=}"; shift ;;
    --fuzz) RUN_FUZZ=1; shift ;;
    *) ctest_args+=("$1"); shift ;;
  esac
done
set -- "${ctest_args[@]+"${ctest_args[@]}"}"
case "$SANITIZE" in
  "") BUILD_DIR="${HEADWAY_BUILD_DIR:-build}" ;;
  address) BUILD_DIR="${HEADWAY_BUILD_DIR:-build-asan}" ;;
  thread) BUILD_DIR="${HEADWAY_BUILD_DIR:-build-tsan}" ;;
  *)
    echo "deploy/test.sh: --sanitize '$SANITIZE': allowed are address, thread" >&2
    exit 2
    ;;
esac

# The ThreadSanitizer run: the step loops and the threads around them (the
# worker's compute thread and step executor, the coordinator's engine behind
# HTTP with fake workers), the control channel, KV transfer over UCX, the
# shm and Gloo all-reduce, and structured output's grammars shared by the
# HTTP threads and the engine thread.
TSAN_TARGETS=(test_comm test_worker test_coordinator test_integration headway-coordinator
              headway-worker)
# Left out, as ThreadSanitizer cannot see what orders them (they pass under
# AddressSanitizer): KV transfer over UCX's shared-memory transports (sm, posix,
# cma), whose FIFOs UCX, not instrumented, synchronizes with plain memory
# accesses; and cases whose receiver runs in a forked child and is told over
# a socket that another process's write completed (TSan follows one process).
TSAN_EXCLUDE='/(sm_self|posix_cma_self)( |$)|^KvTransferCrossProcessTest\.(Tcp|SharedMemory)ReceiverInChildGetsBlocks$|^Transports/KvTransferFaultTest\.'
# (A parameterized case's name starts with its instantiation, "Transports/".)
TSAN_TESTS='^([A-Za-z]+/)?(ComputeThreadTest|StepExecutorTest|CoordinatorFakeWorkerTest|ControlChannel|ControlAuthTest|KvTransfer|KvHandoff|CommunicatorTest|ShmCommunicatorTest|ChildProcessSanitizerTest|GrammarCompiler)\.'

bash deploy/setup.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADWAY_SANITIZE="$SANITIZE"
export HEADWAY_REQUIRE_MODEL=1
# suppressions=FILE for the sanitizer named, when tests/sanitizers has one.
supp() { [[ -f "tests/sanitizers/$1.supp" ]] && echo "suppressions=$PWD/tests/sanitizers/$1.supp:"; true; }
case "$SANITIZE" in
  "")
    cmake --build "$BUILD_DIR" -j"$(nproc)"
    ctest --test-dir "$BUILD_DIR" --output-on-failure -LE slow -j2 "$@"
    ;;
  address)
    cmake --build "$BUILD_DIR" -j"$(nproc)"
    # A report ends the process with a non-zero status (a test binary's fails
    # its CTest case); children's reports fail their test through
    # tests/support/process.cc, which reads them from the child's log.
    export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export LSAN_OPTIONS="$(supp lsan)print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    ctest --test-dir "$BUILD_DIR" --output-on-failure -L 'unit|integration' -LE slow -j2 "$@"
    ;;
  thread)
    # UCX's memory hooks (libucm patches mmap/madvise, loaded with
    # headway_comm) run in glibc's thread exit after ThreadSanitizer has let
    # go of the thread, and crash it: UCX runs without them, as with any
    # allocator it cannot hook. Set before the build, whose test discovery
    # runs the test binaries too.
    export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${TSAN_TARGETS[@]}"
    # Races are reported as found; the process then exits 66.
    export TSAN_OPTIONS="$(supp tsan)second_deadlock_stack=1:history_size=4${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    ctest --test-dir "$BUILD_DIR" --output-on-failure -R "$TSAN_TESTS" -E "$TSAN_EXCLUDE" \
      -LE slow -j2 "$@"
    ;;
esac

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
