#!/bin/bash
# tests/policy-bad.sh: every malformed policy under DIR must make
# `woffload-policy check` exit 2 with a located error (file:line:column:
# error: ..., or file: error: ... for a problem with the whole file), never
# crash and never hang (each run is bounded by a timeout).
#
# A first line "# expect: LINE:COLUMN: TEXT" pins the location and a piece of
# the message; a LINE or COLUMN of * matches any.
#
# usage: policy-bad.sh WOFFLOAD-POLICY DIR [TIMEOUT_SECONDS]
set -u
tool=$1
dir=$2
limit=${3:-10}
fail=0
n=0

for f in "$dir"/*; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    err=$(timeout -k 2 "$limit" "$tool" check "$f" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "FAIL $f: hung (killed after ${limit}s)"
        fail=1
        continue
    fi
    if [ $rc -ne 2 ]; then
        echo "FAIL $f: exit $rc, expected 2"
        printf '%s\n' "$err" | sed 's/^/    /'
        fail=1
        continue
    fi
    expect=$(head -c 300 "$f" | head -n 1 | tr -d '\0' | sed -n 's/^# expect: //p')
    if [ -n "$expect" ]; then
        line=${expect%%:*}
        rest=${expect#*:}
        col=${rest%%:*}
        text=${rest#*: }
        [ "$text" = "$rest" ] && text=""
        [ "$line" = "*" ] && line=""
        [ "$col" = "*" ] && col=""
        pat="^$(printf '%s' "$f" | sed 's/[]\/$*.^[]/\\&/g'):${line:-[0-9]+}:${col:-[0-9]+}: error: "
        if ! printf '%s\n' "$err" | grep -E "$pat" | grep -qF -- "$text"; then
            echo "FAIL $f: no error at ${line:-*}:${col:-*} containing '$text'"
            printf '%s\n' "$err" | sed 's/^/    /'
            fail=1
            continue
        fi
    else
        pat="^$(printf '%s' "$f" | sed 's/[]\/$*.^[]/\\&/g')(:[0-9]+(:[0-9]+)?)?: error: "
        if ! printf '%s\n' "$err" | grep -qE "$pat"; then
            echo "FAIL $f: no located error"
            printf '%s\n' "$err" | sed 's/^/    /'
            fail=1
            continue
        fi
    fi
    # a second line "# errors: N": exactly N errors (follow-on errors dropped)
    want=$(head -c 300 "$f" | sed -n '2{s/^# errors: \([0-9]*\).*/\1/p}' | tr -d '\0')
    if [ -n "$want" ]; then
        got=$(printf '%s\n' "$err" | grep -c ': error: ')
        if [ "$got" != "$want" ]; then
            echo "FAIL $f: $got errors, expected $want"
            printf '%s\n' "$err" | sed 's/^/    /'
            fail=1
            continue
        fi
    fi
    echo "ok   $f: $(printf '%s\n' "$err" | grep -m1 ': error: ' | cut -c1-160)"
done
if [ $n -eq 0 ]; then
    echo "FAIL: no files under $dir"
    exit 1
fi
echo "$n malformed policies checked"
exit $fail
