#!/bin/sh
# tests/test-replay-stream.sh: the replay's streaming executor copies each
# host range once a step. A recorded trace whose steps read the last
# layer's stacked experts twice, a few bytes at the step's start and whole
# at its end (transformers' continuous batching, 32 experts top-4), is
# replayed with every expert on the host under prefetch mode stream: the
# bytes staged a step are the host ranges' bytes (within 1%), where the
# copy made ahead for the next step once took each later read of this step
# for a miss and staged that range five times a step (22.55 GB against
# 19.33 GB), which made `woffload-policy fit` predict a larger budget
# slower (446 ms a step with 1.50 GiB of weights on the device, 411 ms with
# none).
#
# usage: test-replay-stream.sh WOFFLOAD_REPLAY TRACE POLICY
set -u
out=$("$1" "$2" --policy "$3" --top 1000 2>&1) || { echo "FAIL: replay exited $?"; printf '%s\n' "$out" | head; exit 1; }
streamed=$(printf '%s\n' "$out" | sed -n 's/^streamed: *\([0-9.]*\) GB a step.*/\1/p')
# the host ranges' bytes: the table's host rows (bytes in MB or GB)
host=$(printf '%s\n' "$out" | awk '$2 == "host" { v = $3; if ($4 == "GB") v *= 1000; else if ($4 != "MB") v /= 1000; s += v } END { printf "%.3f", s / 1000 }')
echo "streamed $streamed GB a step; the host ranges $host GB"
if [ -z "$streamed" ] || ! awk -v s="$streamed" -v h="$host" 'BEGIN { exit !(h > 1 && s >= 0.99 * h && s <= 1.01 * h) }'; then
    echo "FAIL: the bytes staged a step are not the host ranges' bytes once"
    printf '%s\n' "$out" | sed -n '1,14p'
    exit 1
fi
echo "ok: each host range staged once a step"
