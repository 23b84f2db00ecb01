#!/bin/sh
# tests/test-exit-codes.sh SOURCE_DIR WOFFLOAD WOFFLOAD-POLICY WOFFLOAD-TRACE
#   WOFFLOAD-REPLAY WOFFLOAD-CALIBRATE WOFFLOAD-RUN: every tool exits 0 on
# success, 2 on a usage or input error, 1 on a failure, and says so in its
# --help; bootstrap.sh too (its --help whole, not cut mid-sentence).
set -u
src=$1
shift
tmp=$(mktemp -d /tmp/wo-exit-codes-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE DESCRIPTION -- command...: runs it, output in $tmp/out
expect() {
    want=$1 what=$2
    shift 3
    "$@" >"$tmp/out" 2>&1
    got=$?
    if [ "$got" != "$want" ]; then
        fail "$what: exit $got, expected $want"
        sed 's/^/    /' "$tmp/out" | head -20
    else
        echo "ok   $what (exit $got)"
    fi
}

for tool in "$@"; do
    n=${tool##*/}
    expect 0 "$n --help" -- "$tool" --help
    grep -q "Exit status: 0 success" "$tmp/out" ||
        grep -q "Exit status: 0 when" "$tmp/out" ||
        grep -q "Exit status: CMD's own" "$tmp/out" || fail "$n --help does not state the exit codes"
    expect 2 "$n with an unknown option" -- "$tool" --no-such-option
done

woffload=$1
printf 'version: 1\nrules:\n  - {match: [experts], place: host}\n' >"$tmp/good.yaml"
printf 'version: 1\nrules:\n  - {match: [experts], plase: host}\n' >"$tmp/typo.yaml"
expect 0 "doctor with a policy that loads" -- "$woffload" doctor --policy "$tmp/good.yaml"
expect 2 "doctor with a policy that does not load" -- "$woffload" doctor --policy "$tmp/typo.yaml"
grep -q "does not load" "$tmp/out" || fail "doctor does not say the policy does not load"
grep -q "^libwoffload:" "$tmp/out" || fail "doctor stops at the bad policy instead of reporting the rest"
expect 2 "doctor with a missing policy" -- "$woffload" doctor --policy "$tmp/nope.yaml"
# NVML: a library that cannot be loaded is named, and is no input error
expect 0 "doctor with an unloadable WOFFLOAD_NVML_LIB" -- env WOFFLOAD_NVML_LIB=/nonexistent/libnvml.so "$woffload" doctor
grep -q '^NVML: *none usable (/nonexistent/libnvml.so not loaded' "$tmp/out" ||
    fail "doctor does not say NVML cannot be loaded"
expect 2 "doctor with WOFFLOAD_LOG=loud" -- env WOFFLOAD_LOG=loud "$woffload" doctor
expect 2 "doctor --env with WOFFLOAD_LOG=loud" -- env WOFFLOAD_LOG=loud "$woffload" doctor --env
grep -q 'WOFFLOAD_LOG="loud" is not valid.*using the default' "$tmp/out" ||
    fail "doctor --env does not say the shim uses the default"

expect 0 "bootstrap.sh --help" -- "$src/bootstrap.sh" --help
grep -q "Exit status: 0 success, 2 usage error, 1 failure" "$tmp/out" ||
    fail "bootstrap.sh --help does not state the exit codes"
last=$(grep . "$tmp/out" | tail -n 1)
case "$last" in
*.) ;;
*) fail "bootstrap.sh --help ends mid-sentence: \"$last\"" ;;
esac
expect 2 "bootstrap.sh with an unknown command" -- "$src/bootstrap.sh" frobnicate
expect 2 "bootstrap.sh without a command" -- "$src/bootstrap.sh"

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
