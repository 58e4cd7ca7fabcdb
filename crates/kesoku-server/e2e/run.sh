#!/usr/bin/env bash
# Browser end-to-end test of the web console against the real service (`.ci/run` runs it).
#
# Starts a mock model (`kesoku-mock-model`: Gemini's wire format, each turn answered by what its
# user said) and the real `kesoku start` on a temporary workspace whose config points at that
# model, with a random API token; then drives the console in headless Chromium through
# playwright-core (console.e2e.mjs). The turns are real: the agent runs the shell tool, the store
# is SQLite, stop and the ledger are the service's own.
#
# Needs Debian's chromium (installed here with apt-get when missing and run as root) and node +
# npm (playwright-core, pinned in package-lock.json, is installed here on first run). Usage:
#   crates/kesoku-server/e2e/run.sh                 # run the test
#   crates/kesoku-server/e2e/run.sh --screenshots   # also refresh docs/screenshots/*.png
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
port="${KESOKU_E2E_PORT:-18798}"
model_port="${KESOKU_E2E_MODEL_PORT:-18799}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
chromium="${CHROMIUM:-/usr/bin/chromium}"
work="$(mktemp -d -t kesoku-e2e-XXXXXX)"
token="e2e-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
pids=()
screenshots=""
if [[ "${1:-}" == "--screenshots" ]]; then screenshots="$root/docs/screenshots"; fi

cleanup() {
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

if [[ ! -x "$chromium" ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "== installing Debian's chromium for the console test"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >"$work/apt.log" 2>&1 || {
      apt-get update -q >>"$work/apt.log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$work/apt.log" 2>&1
    } || { echo "installing chromium failed:"; tail -20 "$work/apt.log"; exit 1; }
  else
    echo "chromium is missing at $chromium: install it (apt-get install -y chromium) or set CHROMIUM" >&2
    exit 1
  fi
fi
if [[ ! -d "$here/node_modules/playwright-core" ]]; then
  (cd "$here" && npm ci --no-audit --no-fund --silent)
fi

(cd "$root" && cargo build --quiet -p kesoku --bin kesoku -p kesoku-test-support --bin kesoku-mock-model)

wait_for() { # URL PID NAME LOG
  for _ in $(seq 1 200); do
    if curl -sS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then
      echo "$3 exited early:"; cat "$4"; exit 1
    fi
    sleep 0.1
  done
  echo "$3 did not answer at $1:"; cat "$4"; exit 1
}

"$target_dir/debug/kesoku-mock-model" --addr "127.0.0.1:$model_port" --scenario console >"$work/model.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$model_port/" "${pids[-1]}" "the mock model" "$work/model.log"

cat >"$work/kesoku.toml" <<TOML
[workspace]
dir = "workspace"
database = "sqlite://workspace/kesoku.db"

[agent]
model = "mock"

[models.mock]
provider = "gemini"
model = "gemini-2.5-flash"
base_url = "http://127.0.0.1:$model_port"
api_key_env = "KESOKU_E2E_MODEL_KEY"

[models.mock.retry]
max_attempts = 1

[http]
listen = "127.0.0.1:$port"
token_env = "KESOKU_HTTP_TOKEN"
TOML

"$target_dir/debug/kesoku" -c "$work/kesoku.toml" init --no-model >"$work/init.log" 2>&1 ||
  { echo "kesoku init failed:"; cat "$work/init.log"; exit 1; }
KESOKU_HTTP_TOKEN="$token" KESOKU_E2E_MODEL_KEY="mock-key" KESOKU_LOG="${KESOKU_LOG:-warn}" \
  "$target_dir/debug/kesoku" -c "$work/kesoku.toml" start >"$work/server.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$port/healthz" "${pids[-1]}" "kesoku start" "$work/server.log"

status=0
BASE_URL="http://127.0.0.1:$port" KESOKU_TOKEN="$token" SCREENSHOT_DIR="$screenshots" CHROMIUM="$chromium" \
  node "$here/console.e2e.mjs" || status=$?
if grep -q "panicked" "$work/server.log"; then
  echo "the service panicked:"; grep -A5 "panicked" "$work/server.log"; status=1
fi
if [[ "$status" != 0 ]]; then
  echo "== kesoku start's log"; tail -50 "$work/server.log"
  echo "== the mock model's log"; tail -20 "$work/model.log"
fi
exit "$status"
