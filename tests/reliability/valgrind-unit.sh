#!/bin/sh
# tests/reliability/valgrind-unit.sh: the cmocka unit test executables under
# valgrind memcheck (suite 'valgrind'; run it in a build without sanitizers:
# valgrind and ASan/TSan cannot share a process).
#
# usage: valgrind-unit.sh FAKE_LIBCUDA EXE...
# test-uvm gets FAKE_LIBCUDA as its argument (it dlopen()s the fake driver by
# path), the others none. Every executable runs with --error-exitcode=1
# --leak-check=full; definite and indirect leaks count as errors, "still
# reachable" (the process-lifetime tables of the registry and the fake
# driver) does not. Prints one line per executable and the total time;
# exits 1 when any executable had a memcheck error or failed its own tests.
#
# --fair-sched=yes: valgrind runs one thread at a time, and its default lock
# lets the thread that let go take it back. test-registry's writer loops
# until each of three readers has finished 200 read sections; with the
# default lock the readers starved and that one test took 130 to 500 s
# (CI timed out at 600 s), with the fair lock it takes under 5 s.
set -u

if [ $# -lt 2 ]; then
    echo "usage: $0 FAKE_LIBCUDA EXE..." >&2
    exit 2
fi
fake=$1
shift
if ! command -v valgrind >/dev/null 2>&1; then
    echo "valgrind not installed: skipped"
    exit 77
fi
# A sanitizer build cannot run under valgrind.
for exe in "$@"; do
    if nm -D "$exe" 2>/dev/null | grep -q -e __asan_init -e __tsan_init; then
        echo "$exe is built with a sanitizer: valgrind cannot run it; skipped"
        exit 77
    fi
done

log=$(mktemp -d /tmp/wo-valgrind-XXXXXX)
trap 'rm -rf "$log"' EXIT
start=$(date +%s)
status=0
count=$#
for exe in "$@"; do
    name=$(basename "$exe")
    arg=
    [ "$name" = test-uvm ] && arg=$fake
    t0=$(date +%s)
    # cmocka's own output goes to the log too; the summary line says enough.
    valgrind --fair-sched=yes --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
        --show-leak-kinds=definite,indirect --num-callers=30 \
        --log-file="$log/$name.vg" "$exe" ${arg:+"$arg"} >"$log/$name.out" 2>&1
    rc=$?
    t1=$(date +%s)
    errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$log/$name.vg" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        printf 'ok   %-16s %3ss  memcheck errors: %s\n' "$name" $((t1 - t0)) "${errs:-?}"
    elif [ "${errs:-1}" = 0 ] && grep -q "valgrind: You cannot run" "$log/$name.out"; then
        # A test that re-executes itself through /proc/self/exe gets the
        # valgrind tool binary instead (test-settings' log-file case): its
        # own failure under valgrind says nothing about memory. Every other
        # test of the executable ran, with no memcheck error.
        printf 'ok   %-16s %3ss  memcheck errors: 0 (%s subtest(s) re-execute themselves: not runnable under valgrind)\n' \
            "$name" $((t1 - t0)) "$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s).*/\1/p' "$log/$name.out" | tail -n 1)"
    else
        status=1
        printf 'FAIL %-16s %3ss  exit %s, memcheck errors: %s\n' "$name" $((t1 - t0)) "$rc" "${errs:-?}"
        echo "--- $name: valgrind log (last 80 lines)"
        tail -n 80 "$log/$name.vg"
        echo "--- $name: output (last 40 lines)"
        tail -n 40 "$log/$name.out"
    fi
done
echo "valgrind memcheck: $count executables, $(( $(date +%s) - start ))s"
exit $status
