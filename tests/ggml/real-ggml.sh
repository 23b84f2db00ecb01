#!/bin/sh
# tests/ggml/real-ggml.sh: the ggml hook's tests (suite ggml-real) on a real
# ggml: llama.cpp's libggml-base.so, built here for the CPU (ggml-alloc.c and
# ggml-backend.cpp are the same code in a CUDA build), in front of the hook
# instead of the fake's copy of ggml's allocation (tests/ggml/real-ggml.c).
#
#   tests/ggml/real-ggml.sh [TREE] [WORK]
#
# With LLAMA=1 it also builds libllama.so (about 25 minutes on two cores) and
# the suite's llama-real too (tests/ggml/real-llama.py): llama.cpp's own
# loader, GGUF and scheduler in front of the hook, on a GPU device of the
# test's (tests/ggml/fake-gpu.c), greedy ids equal to plain under the shim's
# policies (needs numpy for the GGUF, and the peers kit in .peers/llamacpp;
# without libllama.so the test is skipped).
#
# TREE: a llama.cpp tree, or an archive of one (default .peers/llama.txz, made
# by bench/llamacpp-kit.sh from a fetched snapshot; CI has none, so CI does not
# run this suite). WORK (default /tmp/woffload-ggml-real): where the tree is
# unpacked, its ggml built (about 10 s on two cores) and the shim configured
# with -Dggml-real. Prints meson's test lines; exit status 0 when every test
# passed, 1 otherwise, 2 on a usage error.
set -eu
cd "$(dirname "$0")/../.."
SRC=${1:-.peers/llama.txz}
W=${2:-/tmp/woffload-ggml-real}
[ -e "$SRC" ] || { echo "real-ggml: no llama.cpp tree at $SRC (bench/llamacpp-kit.sh makes .peers/llama.txz)" >&2; exit 2; }
mkdir -p "$W"
if [ -f "$SRC" ]; then
    if [ ! -d "$W/llama/ggml" ]; then
        tar xJf "$SRC" -C "$W"
    fi
    TREE=$W/llama
else
    TREE=$(cd "$SRC" && pwd)
fi
[ -f "$TREE/ggml/src/ggml-alloc.c" ] || { echo "real-ggml: $TREE has no ggml/src/ggml-alloc.c" >&2; exit 2; }
LIB=$W/ggml-build
# llama.cpp's own options as bench/llamacpp-hook.sh builds it on the GPU
# machine, less CUDA: the same flags for libggml-base.so
cmake -S "$TREE" -B "$LIB" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF >"$W/cmake.log" 2>&1 &&
    cmake --build "$LIB" --target ggml-base $([ "${LLAMA:-0}" = 1 ] && echo llama ggml-cpu ggml) \
        >>"$W/cmake.log" 2>&1 ||
    { echo "real-ggml: building ggml failed ($W/cmake.log)" >&2; exit 1; }
# the hook interposes ggml's calls inside libggml-base.so through its PLT:
# say whether this build calls ggml_backend_buft_get_max_size so
if objdump -d --no-show-raw-insn "$LIB/bin/libggml-base.so" 2>/dev/null |
    grep -q "call.*<ggml_backend_buft_get_max_size@plt>"; then
    echo "real-ggml: libggml-base.so calls ggml_backend_buft_get_max_size through its PLT"
else
    echo "real-ggml: libggml-base.so calls ggml_backend_buft_get_max_size directly: the hook cannot split" >&2
fi
if [ -f "$W/build/build.ninja" ]; then
    meson configure "$W/build" -Dggml-real="$TREE" -Dggml-real-lib="$LIB/bin" >/dev/null
else
    meson setup "$W/build" -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}" -Dggml-real="$TREE" \
        -Dggml-real-lib="$LIB/bin" >"$W/setup.log" 2>&1 ||
        { echo "real-ggml: meson setup failed ($W/setup.log)" >&2; exit 1; }
fi
ninja -C "$W/build" >"$W/ninja.log" 2>&1 || { echo "real-ggml: build failed ($W/ninja.log)" >&2; exit 1; }
meson test -C "$W/build" --no-rebuild --suite ggml-real --num-processes 2 --print-errorlogs
