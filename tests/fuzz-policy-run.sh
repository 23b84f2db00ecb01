#!/bin/bash
# tests/fuzz-policy-run.sh: a bounded fuzz run of the policy parser, for CI.
#
# Builds tests/fuzz-policy (libFuzzer, clang, ASan+UBSan) in its own build
# directory unless one is given, fuzzes from a scratch copy of the committed
# corpus (tests/corpus/policy is never written), and fails on any crash,
# leak, timeout or out-of-memory. Inputs that reached new coverage are left
# in the scratch corpus; copy interesting ones into tests/corpus/policy.
#
# usage: tests/fuzz-policy-run.sh [SECONDS (60)] [BUILD_DIR]
# env:   FUZZ_JOBS (1), FUZZ_OUT (scratch dir, default a temporary one)
set -eu
secs=${1:-60}
src=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$src/build-fuzz-policy}
out=${FUZZ_OUT:-$(mktemp -d)}
jobs=${FUZZ_JOBS:-1}

if ! command -v clang >/dev/null; then
    echo "fuzz-policy-run: clang not found (libFuzzer needs clang)" >&2
    exit 1
fi
if [ ! -x "$build/tests/fuzz-policy" ]; then
    if [ ! -d "$build" ]; then
        CC=clang meson setup "$build" "$src" -Dfuzz=true -Db_sanitize=address,undefined \
            -Db_lundef=false -Dbuildtype=debugoptimized >/dev/null
    else
        meson configure "$build" -Dfuzz=true >/dev/null
    fi
    ninja -C "$build" tests/fuzz-policy
fi

mkdir -p "$out/corpus" "$out/artifacts"
cp "$src"/tests/corpus/policy/* "$out/corpus/"
echo "fuzz-policy-run: ${secs}s, corpus $out/corpus, artifacts $out/artifacts"
# the project links clang's sanitizer runtime shared (-shared-libsan)
rtdir=$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.so)")
export LD_LIBRARY_PATH="$rtdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
set +e
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
ASAN_OPTIONS=detect_leaks=1 \
"$build/tests/fuzz-policy" -max_total_time="$secs" -max_len=8192 -timeout=10 \
    -rss_limit_mb=2048 $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/" "$out/corpus" 2>&1 | tail -n 40
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$out/artifacts")" ]; then
    echo "fuzz-policy-run: FAILED (exit $rc); reproduce with:" >&2
    for f in "$out"/artifacts/*; do
        [ -e "$f" ] && echo "  $build/tests/fuzz-policy $f" >&2
    done
    exit 1
fi
echo "fuzz-policy-run: no crash in ${secs}s"
