#!/bin/bash
# tests/fuzz-run.sh NAME: a bounded fuzz run of the parser tests/fuzz-NAME.c
# checks (policy: the policy parser; trace: the trace reader; gguf: the GGUF
# header reader), for CI; tests/fuzz-NAME-run.sh calls it.
#
# Builds tests/fuzz-NAME (libFuzzer, clang, static ASan+UBSan) in its own
# build directory unless one is given, fuzzes from a scratch copy of the
# committed corpus (tests/corpus/NAME is never written), and fails on any
# crash, leak, timeout, out-of-memory or broken invariant (fuzz-NAME.c).
# Inputs that reached new coverage stay in the scratch corpus; copy the
# interesting ones into tests/corpus/NAME (any name but valid-*/invalid-*).
#
# usage: tests/fuzz-run.sh NAME [SECONDS (60)] [BUILD_DIR]   (either order)
# env:   FUZZ_JOBS (1), FUZZ_OUT (scratch dir, kept; default a temporary one,
#        removed after a clean run)
set -eu
name=${1:?usage: tests/fuzz-run.sh NAME [SECONDS] [BUILD_DIR]}
shift
src=$(cd "$(dirname "$0")/.." && pwd)
secs=60
build=$src/build-fuzz-$name
for a in "$@"; do
    case "$a" in
    '' | *[!0-9]*) build=$a ;;
    *) secs=$a ;;
    esac
done
keep=${FUZZ_OUT:+1}
out=${FUZZ_OUT:-$(mktemp -d)}
# a policy is a short text; a trace or a GGUF header is longer
max_len=65536
[ "$name" = policy ] && max_len=8192
jobs=${FUZZ_JOBS:-1}

if ! command -v clang >/dev/null; then
    echo "fuzz-$name-run: clang not found (libFuzzer needs clang)" >&2
    exit 1
fi
if [ ! -d "$build" ]; then
    # no b_sanitize: the target links ASan+UBSan statically itself
    CC=clang meson setup "$build" "$src" -Dfuzz=true -Dbuildtype=debugoptimized >/dev/null
elif [ ! -x "$build/tests/fuzz-$name" ]; then
    meson configure "$build" -Dfuzz=true >/dev/null
fi
# always: a stale target would fuzz old code
ninja -C "$build" tests/fuzz-$name >/dev/null

mkdir -p "$out/corpus" "$out/artifacts"
cp "$src"/tests/corpus/$name/* "$out/corpus/"
echo "fuzz-$name-run: ${secs}s, corpus $out/corpus, artifacts $out/artifacts"
set +e
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
ASAN_OPTIONS=detect_leaks=1 \
"$build/tests/fuzz-$name" -max_total_time="$secs" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=2048 $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/" "$out/corpus" 2>&1 | tail -n 40
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$out/artifacts")" ]; then
    echo "fuzz-$name-run: FAILED (exit $rc); reproduce with:" >&2
    for f in "$out"/artifacts/*; do
        [ -e "$f" ] && echo "  $build/tests/fuzz-$name $f" >&2
    done
    exit 1
fi
echo "fuzz-$name-run: no crash in ${secs}s"
[ -n "$keep" ] || rm -rf "$out" # a scratch dir of our own; kept when it holds a failure
