#!/bin/sh
# tests/fake/expect-output.sh STATUS PATTERN CMD [ARGS...]: runs CMD and
# passes when it exits with STATUS and its output matches the extended
# regular expression PATTERN. For runs that must fail in one precise way
# (an injected error, no device), where should_fail would accept any crash.
set -u
want=$1 pattern=$2
shift 2
out=$("$@" 2>&1)
got=$?
printf '%s\n' "$out"
if [ "$got" -ne "$want" ]; then
    echo "expect-output: exit status $got, wanted $want" >&2
    exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq "$pattern"; then
    echo "expect-output: no line matches '$pattern'" >&2
    exit 1
fi
