#!/usr/bin/env bash
# bench/stall-stacks.sh: every thread's stack of a process the shim reports
# stuck, for the report of a hang (on the GPU machine, beside a run).
#
#   bench/stall-stacks.sh LOG OUTDIR [PATTERN] [WAIT_S]
#
# Waits (at most WAIT_S [600] seconds) for PATTERN ["looks stuck"] in LOG (the
# shim's WOFFLOAD_LOG_FILE), takes the pid from the shim's "loaded (pid N)"
# line, and writes OUTDIR/stacks-PID.txt: each thread's name, state, kernel
# wait channel and kernel stack (/proc), then its user stacks by gdb, eu-stack
# or py-spy, whichever the machine has (its Python stack too, with py-spy).
# Twice, 2 s apart: a thread in the same driver call both times is the one
# that holds the others. STALL_KILL=1: then kills the process (kill -9), so a
# bench's next row can run. STALL_AT_END=1: takes them at WAIT_S as well when
# PATTERN never came and the process lives (a hang the shim does not report).
# Exit 0 when it wrote them, 1 when PATTERN never came (and no stacks).
set -u
log=${1:?LOG}
out=${2:?OUTDIR}
pat=${3:-looks stuck}
wait_s=${4:-600}
mkdir -p "$out"
end=$(($(date +%s) + wait_s))
until [ -f "$log" ] && grep -q -- "$pat" "$log"; do
    if [ "$(date +%s)" -ge "$end" ]; then
        [ "${STALL_AT_END:-0}" = 1 ] && [ -f "$log" ] && break
        exit 1
    fi
    sleep 0.5
done
pid=$(grep -o 'loaded (pid [0-9]*)' "$log" | tail -1 | grep -o '[0-9]*')
[ -n "$pid" ] && [ -d "/proc/$pid" ] || { echo "stall-stacks: no live pid in $log" >&2; exit 1; }
f=$out/stacks-$pid.txt
for round in 1 2; do
    {
        echo "### round $round, $(date -u +%H:%M:%S.%N) UTC, pid $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline | cut -c1-200)"
        for t in /proc/"$pid"/task/*; do
            tid=${t##*/}
            echo "## tid $tid $(cat "$t"/comm 2>/dev/null) state $(awk '{print $3}' "$t"/stat 2>/dev/null) wchan $(cat "$t"/wchan 2>/dev/null)"
            sed 's/^/    /' "$t"/stack 2>/dev/null | head -20
        done
        if command -v gdb >/dev/null; then
            timeout 60 gdb -p "$pid" -batch -nx -ex "set pagination off" \
                -ex "thread apply all bt 30" 2>&1 | grep -v "^\[New LWP"
        elif command -v eu-stack >/dev/null; then
            timeout 60 eu-stack -p "$pid" 2>&1
        else
            echo "(no gdb or eu-stack)"
        fi
        if command -v py-spy >/dev/null; then
            timeout 60 py-spy dump --native --pid "$pid" 2>&1
        elif python3 -c "import py_spy" 2>/dev/null; then
            timeout 60 python3 -m py_spy dump --native --pid "$pid" 2>&1
        fi
    } >>"$f"
    sleep 2
done
echo "stall-stacks: $f"
[ "${STALL_KILL:-0}" = 1 ] && kill -9 "$pid" 2>/dev/null
exit 0
