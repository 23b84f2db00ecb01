#!/bin/sh
# tests/reliability/flood-once-more.sh CMD...: runs `rel-client flood ...`
# and, when its only failures are a few lost launches, runs it once more.
#
# Why: the flood keeps 48k launches/s on experts going; the 16384-slot ring
# holds 340 ms of them. The consumer cannot drain a ring it is not scheduled
# on (on a 2-vCPU virtual machine the hypervisor can pause the vCPU that
# runs it while the other keeps running the engine's threads), nor pass a
# slot a preempted producer claimed and has not filled (CI, stop 35: 516 of
# 125,000 dropped, backlog peak 2,672, so the consumer was not behind; the
# ring stood still ~350 ms; which of the two it was is not known:
# docs/reliability.md). No design inside the process survives
# that; what the test checks is the design: that the consumer's driver
# calls (5 ms each here) never hold it away from the ring. A defect there
# loses launches in every run (before issue 21: 19% of them), so it fails
# both attempts. A second attempt is made only when the first lost at most
# 1% of the expert launches and failed on nothing else; both outputs are
# printed, with the machine's steal time over each attempt (/proc/stat).
set -u

steal_ms() {
    # the cpu line's 8th value: time stolen by the hypervisor, in USER_HZ
    v=$(awk '/^cpu /{ printf "%d", $9 * 10 }' /proc/stat 2>/dev/null)
    echo "${v:-0}"
}

run() {
    n=$1
    shift
    s0=$(steal_ms)
    out=$("$@" 2>&1)
    rc=$?
    s1=$(steal_ms)
    printf '%s\n' "$out"
    echo "flood-once-more: attempt $n exit $rc; steal time of all CPUs over it: $((s1 - s0)) ms"
    return $rc
}

run 1 "$@" && exit 0
rc=$?
# only the lost-launch family may have failed
others=$(printf '%s\n' "$out" | grep '^FAIL' |
    grep -v -e '^FAIL dropped watched launches' -e '^FAIL the consumer saw' -e '^FAIL name ')
dropped=$(printf '%s\n' "$out" | sed -n 's/.*dropped \([0-9]*\) (watched \([0-9]*\),.*/\2/p')
watched=$(printf '%s\n' "$out" | sed -n 's/^flood .*, \([0-9]*\) touch an expert$/\1/p')
if [ -n "$others" ] || [ -z "$dropped" ] || [ -z "$watched" ] || [ "$watched" -eq 0 ]; then
    echo "flood-once-more: not retried: it failed on more than lost launches"
    exit $rc
fi
if [ $((dropped * 100)) -gt "$watched" ]; then
    echo "flood-once-more: not retried: $dropped of $watched expert launches lost, over 1%"
    exit $rc
fi
echo "flood-once-more: $dropped of $watched expert launches lost (<= 1%), nothing else failed: once more"
run 2 "$@"
