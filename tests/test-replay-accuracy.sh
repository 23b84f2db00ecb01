#!/bin/sh
# tests/test-replay-accuracy.sh: the replay's predictions against what the
# lent H100 measured (issue 7). One trace recorded with every weight on the
# GPU (tests/traces/h100-eager-moe-decode-gpu.wot.gz: transformers' eager
# experts backend, bench/e2e.py trace-eager-gpu-b, 2026-11-22 16:52 UTC) is
# replayed under three placements; each predicted median decode step is
# compared with the median of the same session's measured runs
# (bench/results/e2e-20261122-165202-issue7-replay-accuracy-warm.md: three
# all-GPU, two experts-on-host, two experts-managed runs after 128 warm-up
# steps, one process each; the lent VM's host speed moved by up to 1.5x
# between processes).
# Tolerances: all on GPU and experts on host 15% (the target);
# managed 30%, what the model reaches today: it predicts managed too fast
# (-23%; docs/prefetch.md, "How well the replay predicts").
# usage: test-replay-accuracy.sh WOFFLOAD_REPLAY TRACE MODEL POLICY_DIR
set -u
replay=$1
trace=$2
model=$3
pol=$4
fails=0

# check NAME POLICY MEASURED_MS TOLERANCE
check() {
    out=$("$replay" "$trace" --policy "$pol/$2" --device "$model" --top 0 2>&1)
    st=$?
    pred=$(printf '%s\n' "$out" | sed -n 's/^median step: *\([0-9.]*\) ms.*/\1/p')
    if [ "$st" != 0 ] || [ -z "$pred" ]; then
        echo "FAIL: $1: woffload-replay exited $st"
        printf '%s\n' "$out" | head -20
        fails=$((fails + 1))
        return
    fi
    if awk -v p="$pred" -v m="$3" -v t="$4" 'BEGIN { r = p / m; exit !(r >= 1 - t && r <= 1 + t) }'; then
        echo "ok: $1: predicted $pred ms, measured $3 ms (within $4)"
    else
        echo "FAIL: $1: predicted $pred ms, measured $3 ms (outside $4)"
        fails=$((fails + 1))
    fi
}

check "all on GPU" all-device.yaml 50.9 0.15
check "experts on host" experts-host.yaml 91.9 0.15
check "experts managed, 9 GiB budget" experts-managed-9g.yaml 67.6 0.30
exit $((fails > 0))
