#!/usr/bin/env bash
# Builds Headway and runs its test suite, as CI does: installs what is
# missing (deploy/setup.sh), builds into build/, then runs every test except
# those labelled `slow`. HEADWAY_REQUIRE_MODEL=1 turns a missing model into a
# failure instead of a skip.
#
# Usage: bash deploy/test.sh [extra ctest arguments, e.g. -L unit or -R Config]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${HEADWAY_BUILD_DIR:-build}"

bash deploy/setup.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$(nproc)"

export HEADWAY_REQUIRE_MODEL=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -LE slow -j2 "$@"
