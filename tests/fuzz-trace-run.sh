#!/bin/bash
# tests/fuzz-trace-run.sh: a bounded fuzz run of the trace reader, for CI.
#
# Builds tests/fuzz-trace (libFuzzer, clang, static ASan+UBSan) in its own
# build directory unless one is given, fuzzes from a scratch copy of the
# committed corpus (tests/corpus/trace is never written), and fails on any
# crash, leak, timeout, out-of-memory or broken invariant (fuzz-trace.c).
# Inputs that reached new coverage stay in the scratch corpus; copy the
# interesting ones into tests/corpus/trace (any name but valid-*/invalid-*).
#
# usage: tests/fuzz-trace-run.sh [SECONDS (60)] [BUILD_DIR]   (either order)
# env:   FUZZ_JOBS (1), FUZZ_OUT (scratch dir, default a temporary one)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
secs=60
build=$src/build-fuzz-trace
for a in "$@"; do
    case "$a" in
    '' | *[!0-9]*) build=$a ;;
    *) secs=$a ;;
    esac
done
out=${FUZZ_OUT:-$(mktemp -d)}
jobs=${FUZZ_JOBS:-1}

if ! command -v clang >/dev/null; then
    echo "fuzz-trace-run: clang not found (libFuzzer needs clang)" >&2
    exit 1
fi
if [ ! -d "$build" ]; then
    CC=clang meson setup "$build" "$src" -Dfuzz=true -Dbuildtype=debugoptimized >/dev/null
elif [ ! -x "$build/tests/fuzz-trace" ]; then
    meson configure "$build" -Dfuzz=true >/dev/null
fi
# always: a stale target would fuzz old code
ninja -C "$build" tests/fuzz-trace >/dev/null

mkdir -p "$out/corpus" "$out/artifacts"
cp "$src"/tests/corpus/trace/* "$out/corpus/"
echo "fuzz-trace-run: ${secs}s, corpus $out/corpus, artifacts $out/artifacts"
set +e
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
ASAN_OPTIONS=detect_leaks=1 \
"$build/tests/fuzz-trace" -max_total_time="$secs" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/" "$out/corpus" 2>&1 | tail -n 40
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$out/artifacts")" ]; then
    echo "fuzz-trace-run: FAILED (exit $rc); reproduce with:" >&2
    for f in "$out"/artifacts/*; do
        [ -e "$f" ] && echo "  $build/tests/fuzz-trace $f" >&2
    done
    exit 1
fi
echo "fuzz-trace-run: no crash in ${secs}s"
