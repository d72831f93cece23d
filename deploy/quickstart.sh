#!/usr/bin/env bash
# Headway from nothing to one answer: installs what is missing
# (deploy/setup.sh), builds, starts the default deployment
# (deploy/configs/local.yaml: SmolLM2-135M-Instruct on CPU) in the
# background, asks it one question through /v1/completions, prints the answer
# and the decode speed, and stops the deployment again.
#
# Usage: bash deploy/quickstart.sh [CONFIG]
# Environment: HEADWAY_MODEL_DIR (model directory), HEADWAY_BUILD_DIR
# (default build), HEADWAY_MODEL_NAME (the config's model.served_name).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CONFIG="${1:-deploy/configs/local.yaml}"
BUILD_DIR="${HEADWAY_BUILD_DIR:-build}"
MODEL_NAME="${HEADWAY_MODEL_NAME:-smollm2-135m-instruct}"
READY_TIMEOUT_S=180

bash deploy/setup.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$(nproc)"

work=$(mktemp -d)
launcher_pid=""
stop_launcher() {
  if [[ -n $launcher_pid ]] && kill -0 "$launcher_pid" 2>/dev/null; then
    echo "quickstart: stopping the deployment"
    kill -TERM "$launcher_pid" 2>/dev/null || true
    wait "$launcher_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap stop_launcher EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "quickstart: starting $BUILD_DIR/bin/headway-launch $CONFIG (log: launcher output below on failure)"
"$BUILD_DIR/bin/headway-launch" "$CONFIG" >"$work/launch.log" 2>&1 &
launcher_pid=$!

url=""
for ((i = 0; i < READY_TIMEOUT_S * 5; i++)); do
  url=$(sed -n 's|^headway: ready at \(http://[^ ]*\) .*|\1|p' "$work/launch.log")
  [[ -n $url ]] && break
  if ! kill -0 "$launcher_pid" 2>/dev/null; then
    cat "$work/launch.log" >&2
    echo "quickstart: the launcher exited before the deployment was ready" >&2
    exit 1
  fi
  sleep 0.2
done
if [[ -z $url ]]; then
  cat "$work/launch.log" >&2
  echo "quickstart: not ready after ${READY_TIMEOUT_S} s" >&2
  exit 1
fi
grep '^headway: ready at' "$work/launch.log"

prompt=$'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n'
python3 -c '
import json, sys
print(json.dumps({"model": sys.argv[1], "prompt": sys.argv[2], "max_tokens": 64,
                  "temperature": 0, "stop": ["<|im_end|>"]}))
' "$MODEL_NAME" "$prompt" >"$work/request.json"

echo "quickstart: POST $url/v1/completions: What is the capital of France?"
curl_out=$(curl -sS -o "$work/response.json" -w '%{http_code} %{time_total}' \
  -H 'Content-Type: application/json' --data-binary "@$work/request.json" \
  "$url/v1/completions")
read -r http_code wall_s <<<"$curl_out"
if [[ $http_code != 200 ]]; then
  echo "quickstart: HTTP $http_code:" >&2
  cat "$work/response.json" >&2
  echo >&2
  exit 1
fi

python3 -c '
import json, sys
response = json.load(open(sys.argv[1]))
wall_s = float(sys.argv[2])
text = response["choices"][0]["text"]
tokens = response.get("usage", {}).get("completion_tokens", 0)
print("answer:", text.strip())
print("%d tokens in %.2f s = %.1f tokens/s" % (tokens, wall_s, tokens / wall_s if wall_s > 0 else 0.0))
' "$work/response.json" "$wall_s"
