#!/bin/sh
# tests/test-replay-accuracy.sh: the replay's predictions against what the
# lent H100 measured (issue 7).
#
# One all-GPU trace (tests/traces/h100-eager-moe-r7-gpu.wot.gz: transformers'
# eager experts backend, bench/e2e.py r7-trace-gpu, 2026-11-22 18:08 UTC) is
# replayed under three placements; each predicted mean decode step is
# compared with what three sessions measured with the very same calls (2
# warm-up generates of 17 tokens, then 3 timed; the trace's first 34 steps
# are those warm-up calls): in each session three runs of each placement,
# alternating, one process each; measured = 1 / the median of the nine
# calls' decode rates (bench/results/e2e-20261122-180852-issue7-r7.md, the
# trace's own session, e2e-20261122-182044-issue7-r7-second.md and
# e2e-20261122-190306-issue7-r7-third.md).
#
# The lent VM's host speed drifts: the all-GPU calls of the first session
# took 47.0 to 78.7 ms a step, the trace's own run 57.7 ms. The engine is
# launch-bound, so every placement's step moves with it. The replay is
# therefore checked at each session's host speed: --host-step gives it the
# all-GPU step the session measured, from which it scales the recorded host
# work (one number, fit on the all-GPU placement only); the host and managed
# predictions stay out of sample. Held to: experts on host 15% (the issue's
# target; -9%, -12%, -2%), managed 25% (-7%, -19%, -19%: the model misses
# part of what managed costs, docs/prefetch.md). The uncalibrated
# predictions (the trace run's host speed) are held to 25%.
# The managed runs were made with the prefetcher's executor before 61ad634
# (whole ranges read-mostly: misses faulted GPU copies in); the replay now
# models the executor that keeps the budget (docs/prefetch.md). Those rows
# guard against regressions of the model until they are measured again.
# usage: test-replay-accuracy.sh WOFFLOAD_REPLAY TRACE MODEL POLICY_DIR
set -u
replay=$1
trace=$2
model=$3
pol=$4
fails=0

# check NAME POLICY MEASURED_MS TOLERANCE [REPLAY OPTIONS...]
check() {
    name=$1 policy=$2 meas=$3 tol=$4
    shift 4
    out=$("$replay" "$trace" --policy "$pol/$policy" --device "$model" --warmup 34 --top 0 "$@" 2>&1)
    st=$?
    pred=$(printf '%s\n' "$out" | sed -n 's/^decode step: *\([0-9.]*\) ms.*/\1/p')
    if [ "$st" != 0 ] || [ -z "$pred" ]; then
        echo "FAIL: $name: woffload-replay exited $st"
        printf '%s\n' "$out" | head -20
        fails=$((fails + 1))
        return
    fi
    if awk -v p="$pred" -v m="$meas" -v t="$tol" 'BEGIN { r = p / m; exit !(r >= 1 - t && r <= 1 + t) }'; then
        echo "ok: $name: predicted $pred ms, measured $meas ms (within $tol)"
    else
        echo "FAIL: $name: predicted $pred ms, measured $meas ms (outside $tol)"
        fails=$((fails + 1))
    fi
}

# session MEASURED_GPU MEASURED_HOST MEASURED_MANAGED
session() {
    echo "session measured $1 / $2 / $3 ms; at its host speed (--host-step $1):"
    # the calibration point itself: this checks that --host-step finds the
    # host speed (to 0.1%), not the model
    check "all on GPU (calibration)" all-device.yaml "$1" 0.001 --host-step "$1"
    check "experts on host" experts-host.yaml "$2" 0.15 --host-step "$1"
    check "experts managed, 9 GiB budget" experts-managed-9g.yaml "$3" 0.25 --host-step "$1"
    echo "the same at the trace run's host speed:"
    check "all on GPU" all-device.yaml "$1" 0.25
    check "experts on host" experts-host.yaml "$2" 0.25
    check "experts managed, 9 GiB budget" experts-managed-9g.yaml "$3" 0.25
}
session 65.60 112.61 74.18
session 52.17 104.08 68.84
session 54.21 94.95 71.30
exit $((fails > 0))
