#!/bin/sh
# tests/test-replay-cost.sh: the prefetcher never loses to reading in place
# (issue 22). Synthetic traces of continuous-batching-like steps (tests/
# gen-trace --tokens: each step routes several tokens, and each expert a
# step picked is launched once) are replayed with every expert on the host
# and with every expert managed within half the experts' bytes:
#
# - uniform routing (the union of a few steps' experts is all of them): the
#   managed step is at most 1.02x the host step, both as the replay's
#   simulation predicts it and as the planner's cost rule (uvm/cost.h)
#   prices the window's reads and moves; the planner moves at most 10% of
#   the budget in a step (issue 22's steady-state target) and never warns
#   of churn;
# - skewed routing: managed is at least 1.5x faster than host, both ways.
#
# usage: test-replay-cost.sh WOFFLOAD_REPLAY MODEL POLICY_DIR UNIFORM_TRACE... -- SKEWED_TRACE...
set -u
replay=$1 model=$2 pol=$3
shift 3
fails=0

# field OUTPUT PREFIX: the first number after PREFIX on its line
field() {
    printf '%s\n' "$1" | sed -n "s/^$2 *\([0-9.]*\).*/\1/p" | head -1
}

run() {
    "$replay" "$1" --policy "$pol/$2" --budget 50% --device "$model" --top 0 2>&1
}

# fail_unless NAME AWK-CONDITION: the condition sees h, m, hi, pl, mv
fail_unless() {
    if awk -v h="$h" -v m="$m" -v ci="$ci" -v cp="$cp" -v mv="$mv" "BEGIN { exit !($2) }"; then
        echo "ok: $1"
    else
        echo "FAIL: $1"
        fails=$((fails + 1))
    fi
}

kind=uniform
for t in "$@"; do
    if [ "$t" = -- ]; then
        kind=skewed
        continue
    fi
    ho=$(run "$t" experts-host.yaml) || { echo "FAIL: $t: host replay exited $?"; printf '%s\n' "$ho" | head; fails=$((fails + 1)); continue; }
    mo=$(run "$t" experts-managed.yaml) || { echo "FAIL: $t: managed replay exited $?"; printf '%s\n' "$mo" | head; fails=$((fails + 1)); continue; }
    h=$(field "$ho" "step time:")
    m=$(field "$mo" "step time:")
    ci=$(printf '%s\n' "$mo" | sed -n 's/^cost rule: *managed reads in place \([0-9.]*\) ms.*/\1/p')
    cp=$(printf '%s\n' "$mo" | sed -n 's/^cost rule: .*as planned \([0-9.]*\) ms.*/\1/p')
    mv=$(printf '%s\n' "$mo" | sed -n 's/^moves \/ step: .*(\([0-9.]*\)% of the budget moved in).*/\1/p')
    if [ -z "$h" ] || [ -z "$m" ] || [ -z "$ci" ] || [ -z "$cp" ] || [ -z "$mv" ]; then
        echo "FAIL: $t: a figure is missing from the report"
        printf '%s\n' "$mo" | head -20
        fails=$((fails + 1))
        continue
    fi
    echo "$(basename "$t") ($kind): host $h ms, managed $m ms a step; cost rule: in place $ci ms, plan $cp ms; moved in $mv% of the budget a step"
    if [ "$kind" = uniform ]; then
        fail_unless "managed <= 1.02x host (replay)" "m <= 1.02 * h"
        fail_unless "plan <= 1.02x in place (cost rule)" "cp <= 1.02 * ci"
        fail_unless "moved in <= 10% of the budget a step" "mv <= 10"
        if printf '%s\n' "$mo" | grep -q '^warning: .*device budget'; then
            echo "FAIL: the churn warning fired"
            fails=$((fails + 1))
        fi
    else
        fail_unless "managed >= 1.5x faster than host (replay)" "h >= 1.5 * m"
        fail_unless "plan >= 1.5x faster than in place (cost rule)" "ci >= 1.5 * cp"
    fi
done
exit $((fails > 0))
