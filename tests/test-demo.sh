#!/bin/sh
# tests/test-demo.sh: the README's main job without a GPU: `woffload demo
# --replay` replays the bundled all-GPU trace (.wot.gz, read compressed)
# under examples/moe-experts-host.yaml and must print the placement by name,
# the predicted decode step both ways, the bytes over PCIe per token (four
# experts of 37.7 MB in each of 16 layers: 2.4 GB) and where the time goes;
# the managed example with a 9 GiB budget must move far fewer bytes.
# The replay runs the trace through a device model, no clock: its figures
# are the same on every machine, so the README quotes the summary exactly
# and this test fails when the two drift. The per-name PCIe column adds up
# to the summary, and the footer's --policy path exists.
# usage: test-demo.sh WOFFLOAD README
set -u
woffload=$1
readme=$2
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
out=$("$woffload" demo --replay 2>&1)
st=$?
for pat in 'model\.layers\.\*\.mlp\.experts\.gate_up_proj +16 host' 'predicted tok/s +[0-9.]+ +[0-9.]+' \
    'bytes over PCIe per token +0 B +2\.[2-5][0-9] GB' 'weights read in place over PCIe +2\.[2-5][0-9] GB' \
    'longer than all on GPU' 'PCIe per token: a decode step'; do
    printf '%s\n' "$out" | grep -Eq "$pat" || fail "demo output lacks /$pat/"
done
[ "$st" = 0 ] || fail "woffload demo --replay exited $st"

# the README quotes the summary lines as the demo prints them
for key in 'per decode step (one token)' 'predicted step time' 'predicted tok/s' 'bytes over PCIe per token'; do
    line=$(printf '%s\n' "$out" | grep -F -m1 "$key")
    [ -n "$line" ] || { fail "demo output has no '$key' line"; continue; }
    grep -qxF -- "$line" "$readme" ||
        fail "README.md does not quote the demo's line exactly (update its demo block): '$line'"
done

# the per-name column adds up to the summary (to the printed rounding)
printf '%s\n' "$out" | awk '
    function gb(v, u) { return u == "GB" ? v : u == "MB" ? v / 1e3 : u == "kB" ? v / 1e6 : v / 1e9 }
    /^Placement by name/ { t = 1; next }
    t && /^  total / { total = gb($(NF - 1), $NF); t = 0; next }
    t && NF >= 2 && $NF ~ /^(GB|MB|kB|B)$/ && $(NF - 1) ~ /^[0-9.]+$/ { sum += gb($(NF - 1), $NF) }
    /^bytes over PCIe per token/ { summary = gb($(NF - 1), $NF) }
    END {
        d = sum - summary; if (d < 0) d = -d
        if (d > 0.0151 || total != summary) {
            printf "FAIL: the per-name PCIe column adds up to %.3f GB, its total says %.3f, the summary %.3f\n", sum, total, summary
            exit 1
        }
        printf "ok   the per-name PCIe column adds up to the summary (%.3f GB of %.3f)\n", sum, summary
    }' || fails=$((fails + 1))

# the footer's policy path is one that exists
pol=$(printf '%s\n' "$out" | sed -n 's/.*woffload demo --policy \([^ ]*\).*/\1/p' | head -n 1)
[ -n "$pol" ] && [ -f "$pol" ] || fail "the footer's --policy path does not exist: '$pol'"

man=$(WO_EXPERT_BUDGET=9GiB "$woffload" demo --replay --policy "$pol" 2>&1)
printf '%s\n' "$man" | grep -Eq 'bytes over PCIe per token +0 B +[0-9.]+ MB' ||
    fail "managed demo does not move megabytes a token"
# a bad trace path is one clear line, not a crash
bad=$("$woffload" demo --replay --trace /nonexistent/x.wot.gz 2>&1)
[ $? != 0 ] && printf '%s\n' "$bad" | grep -q 'x.wot.gz' || fail "a missing trace: $bad"
[ "$fails" = 0 ] && echo "ok: demo" || printf '%s\n' "$out" | head -60
exit $((fails > 0))
