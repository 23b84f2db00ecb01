#!/bin/bash
# tests/fuzz-policy-run.sh: a bounded fuzz run of the policy parser, for CI.
#
# Builds tests/fuzz-policy (libFuzzer, clang, static ASan+UBSan) in its own build
# directory unless one is given, fuzzes from a scratch copy of the committed
# corpus (tests/corpus/policy is never written), and fails on any crash,
# leak, timeout or out-of-memory. Inputs that reached new coverage are left
# in the scratch corpus; copy interesting ones into tests/corpus/policy.
#
# AFL++ instead: build tests/fuzz-policy-replay with CC=afl-clang-fast and run
#   afl-fuzz -i tests/corpus/policy -o OUT -- BUILD/tests/fuzz-policy-replay
# (it reads the input from stdin when given no arguments).
#
# usage: tests/fuzz-policy-run.sh [SECONDS (60)] [BUILD_DIR]
# env:   FUZZ_JOBS (1), FUZZ_OUT (scratch dir, kept; default a temporary one,
#        removed after a clean run)
set -eu
secs=${1:-60}
src=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$src/build-fuzz-policy}
keep=${FUZZ_OUT:+1}
out=${FUZZ_OUT:-$(mktemp -d)}
jobs=${FUZZ_JOBS:-1}

if ! command -v clang >/dev/null; then
    echo "fuzz-policy-run: clang not found (libFuzzer needs clang)" >&2
    exit 1
fi
if [ ! -x "$build/tests/fuzz-policy" ]; then
    if [ ! -d "$build" ]; then
        # no b_sanitize: the target links ASan+UBSan statically itself
        CC=clang meson setup "$build" "$src" -Dfuzz=true -Dbuildtype=debugoptimized >/dev/null
    else
        meson configure "$build" -Dfuzz=true >/dev/null
    fi
    ninja -C "$build" tests/fuzz-policy
fi

mkdir -p "$out/corpus" "$out/artifacts"
cp "$src"/tests/corpus/policy/* "$out/corpus/"
echo "fuzz-policy-run: ${secs}s, corpus $out/corpus, artifacts $out/artifacts"
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
[ -n "$keep" ] || rm -rf "$out" # a scratch dir of our own; kept when it holds a failure
