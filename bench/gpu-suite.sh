#!/bin/sh
# bench/gpu-suite.sh OUT.txt [TEST...]: build and run the gpu suite on the GPU
# machine, the log (machine, commit, every test's output) written to OUT.txt.
# TESTs: only those (the suite outgrew one device call of 600 s: run it in
# two, the build kept between them).
#
# The lent GPU machine has no package registry: its libyaml and cmocka come
# as Debian packages unpacked under build-yaml/root (bench/README.md says how
# to make it; carry it along). Elsewhere the system's are used.
set -u
cd "$(dirname "$0")/.."
out=${1:?usage: bench/gpu-suite.sh OUT.txt [TEST...]}
shift
pc=$PWD/build-yaml/root/usr/lib/x86_64-linux-gnu
if [ -d "$pc/pkgconfig" ]; then
    export PKG_CONFIG_PATH=$pc/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$pc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
{
    echo "# gpu suite: $(date -u '+%Y-%m-%d %H:%M UTC')"
    # The device machine's copy of the tree may carry stale git metadata:
    # WO_COMMIT names the commit the tree is (git rev-parse --short HEAD here).
    echo "commit: ${WO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv,noheader 2>&1
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1
    echo "\$ meson setup build-gpu && meson test -C build-gpu --setup gpu --suite gpu $*"
} >"$out"
if [ ! -f build-gpu/build.ninja ]; then
    meson setup build-gpu -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}" >>"$out" 2>&1 || { echo "setup failed" >>"$out"; exit 1; }
fi
ninja -C build-gpu >>"$out" 2>&1 || { echo "build failed" >>"$out"; exit 1; }
meson test -C build-gpu --setup gpu --suite gpu --print-errorlogs --verbose "$@" >>"$out" 2>&1
rc=$?
echo "meson test exit: $rc" >>"$out"
exit $rc
