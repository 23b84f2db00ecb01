#!/bin/sh
# tests/test-start-line.sh PRELOAD FAKE_DIR: at WOFFLOAD_LOG=info or debug the
# shim says one line when a process starts (version, policy, whether the
# driver library can be found), even in a program that never calls CUDA;
# at the default level, nothing. On the fake driver (FAKE_DIR has libcuda.so.1).
set -u
preload=$1
fake=$2
# python keeps memory to the end: no leak check (as interpose-python-start)
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=0:verify_asan_link_order=0"
tmp=$(mktemp -d /tmp/wo-start-line-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
printf 'version: 1\n' >"$tmp/p.yaml"

# a program that never touches CUDA: python3 when there is one (the
# interpreter itself: a pyenv shim is a shell script that execs several
# times, each exec a start), else echo
py=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null)
if [ -n "$py" ] && [ -x "$py" ]; then
    prog="$py -c print(1)"
else
    prog="echo 1"
fi

# shellcheck disable=SC2086
out=$(env LD_PRELOAD="$preload" LD_LIBRARY_PATH="$fake" WOFFLOAD_LOG=debug WOFFLOAD_POLICY="$tmp/p.yaml" \
    $prog 2>&1)
printf '%s\n' "$out" | grep -q '^1$' || fail "the program's own output is missing: $out"
printf '%s\n' "$out" | grep -Eq "^woffload: info: libwoffload [0-9][^ ]* loaded \(pid [0-9]+\); policy: $tmp/p.yaml; CUDA driver libcuda.so.1: found in $fake\$" ||
    fail "no start line naming the policy and the fake driver: $out"
[ "$(printf '%s\n' "$out" | grep -c '^woffload: info: libwoffload')" = 1 ] || fail "not one start line: $out"

out=$(env LD_PRELOAD="$preload" WOFFLOAD_LOG=info WOFFLOAD_CUDA_LIB=/nonexistent/libcuda.so.1 true 2>&1)
printf '%s\n' "$out" | grep -Eq '^woffload: info: libwoffload .*; policy: none \(every allocation passes through\); CUDA driver /nonexistent/libcuda.so.1: not found' ||
    fail "no start line saying the driver is not found: $out"

out=$(env LD_PRELOAD="$preload" WOFFLOAD_LOG=debug WOFFLOAD_LOG_FILE="$tmp/log" true 2>&1)
grep -q '^woffload: info: libwoffload' "$tmp/log" 2>/dev/null || fail "the start line is not in WOFFLOAD_LOG_FILE"

for lv in "" warn error; do
    out=$(env LD_PRELOAD="$preload" LD_LIBRARY_PATH="$fake" ${lv:+WOFFLOAD_LOG=$lv} true 2>&1)
    [ -z "$out" ] || fail "WOFFLOAD_LOG=${lv:-(unset)} says something at start: $out"
done

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "ok   the start line"
