#!/usr/bin/env bash
# Browser end-to-end test of the web console (not part of `cargo test`: it needs Chromium).
#
# Starts the `console_demo` example (real server, temporary SQLite store, fake agent runtime
# that answers with a thought, a tool call, its result and a final text) with a random token,
# then drives the console in headless Chromium through playwright-core (console.e2e.mjs).
#
# Needs: Debian's chromium (`apt-get install -y chromium`), node + npm (playwright-core is
# installed here on first run). Usage:
#   crates/kesoku-server/e2e/run.sh                 # run the test
#   crates/kesoku-server/e2e/run.sh --screenshots   # also refresh docs/screenshots/*.png
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
port="${KESOKU_E2E_PORT:-18798}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d -t kesoku-e2e-XXXXXX)"
token="e2e-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
server_pid=""
screenshots=""
if [[ "${1:-}" == "--screenshots" ]]; then screenshots="$root/docs/screenshots"; fi

cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if [[ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]]; then
  echo "chromium is missing: apt-get install -y chromium" >&2
  exit 1
fi
if [[ ! -d "$here/node_modules/playwright-core" ]]; then
  (cd "$here" && npm install --no-audit --no-fund --silent)
fi

(cd "$root" && cargo build --quiet -p kesoku-server --example console_demo)

KESOKU_HTTP_TOKEN="$token" RUST_LOG="${RUST_LOG:-warn}" \
  "$target_dir/debug/examples/console_demo" --addr "127.0.0.1:$port" --delay-ms 700 --workspace "$work/workspace" \
  >"$work/server.out" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "the demo server exited early:"; cat "$work/server.log"; exit 1
  fi
  sleep 0.1
done

status=0
BASE_URL="http://127.0.0.1:$port" KESOKU_TOKEN="$token" SCREENSHOT_DIR="$screenshots" \
  node "$here/console.e2e.mjs" || status=$?
if grep -q "panicked" "$work/server.log"; then
  echo "the server panicked:"; grep -A5 "panicked" "$work/server.log"; status=1
fi
exit "$status"
