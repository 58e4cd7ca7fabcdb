#!/usr/bin/env bash
# Schema-based fuzzing of the HTTP API with schemathesis (PyPI).
#
# Starts the `console_demo` example (a real server over a temporary SQLite store, with a fake
# agent runtime) on 127.0.0.1 with a random token, fetches its OpenAPI document, and runs
# schemathesis with every check against every operation except the endless event stream
# (`GET /v1/events`, covered by the Rust tests). Fails when schemathesis finds anything (a 5xx,
# a response that does not match the schema, a status or content type not documented, data the
# schema forbids being accepted or data it allows being refused, auth being ignored), or when
# the server logged a panic.
#
# Usage: crates/kesoku-server/fuzz/schemathesis.sh [extra schemathesis arguments]
# Environment: KESOKU_FUZZ_PORT (default 18799), KESOKU_FUZZ_MAX_EXAMPLES (default 100),
#   KESOKU_SCHEMATHESIS_VENV (default ~/.cache/kesoku-schemathesis-venv; created when missing),
#   CARGO_TARGET_DIR (as usual).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
port="${KESOKU_FUZZ_PORT:-18799}"
max_examples="${KESOKU_FUZZ_MAX_EXAMPLES:-100}"
venv="${KESOKU_SCHEMATHESIS_VENV:-$HOME/.cache/kesoku-schemathesis-venv}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d -t kesoku-fuzz-XXXXXX)"
token="fuzz-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
server_pid=""

cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if [[ ! -x "$venv/bin/schemathesis" ]]; then
  echo "installing schemathesis into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet schemathesis
fi
echo "schemathesis $("$venv/bin/schemathesis" --version | awk '{print $NF}')"

(cd "$root" && cargo build --quiet -p kesoku-server --example console_demo)

KESOKU_HTTP_TOKEN="$token" RUST_LOG="${RUST_LOG:-warn,kesoku_server=info}" \
  "$target_dir/debug/examples/console_demo" --addr "127.0.0.1:$port" --delay-ms 20 --workspace "$work/workspace" \
  >"$work/server.out" 2>"$work/server.log" &
server_pid=$!

for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "the demo server exited early:"; cat "$work/server.log"; exit 1
  fi
  sleep 0.1
done
curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$port/openapi.json" -o "$work/openapi.json"

status=0
# Run from the scratch folder: schemathesis keeps a cache in the current directory.
cd "$work"
"$venv/bin/schemathesis" run "$work/openapi.json" \
  --url "http://127.0.0.1:$port" \
  --header "Authorization: Bearer $token" \
  --checks all \
  --exclude-path /v1/events \
  --max-examples "$max_examples" \
  --workers 2 \
  --request-timeout 10 \
  --no-color \
  "$@" || status=$?

if grep -q "panicked" "$work/server.log"; then
  echo "the server panicked during the run:"; grep -A5 "panicked" "$work/server.log"; status=1
fi
server_errors="$(grep -c " ERROR " "$work/server.log" || true)"
echo "server log: ${server_errors} error line(s)"
if [[ "$server_errors" != "0" ]]; then grep " ERROR " "$work/server.log" | head -20; status=1; fi
exit "$status"
