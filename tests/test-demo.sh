#!/bin/sh
# tests/test-demo.sh: the README's main job without a GPU: `woffload demo
# --replay` replays the bundled all-GPU trace (.wot.gz, read compressed)
# under examples/moe-experts-host.yaml and must print the placement by name,
# the predicted decode step both ways, the bytes over PCIe per token (four
# experts of 37.7 MB in each of 16 layers: 2.4 GB) and where the time goes;
# the managed example with a 9 GiB budget must move far fewer bytes.
# usage: test-demo.sh WOFFLOAD
set -u
woffload=$1
fails=0
out=$("$woffload" demo --replay 2>&1)
st=$?
for pat in 'model\.layers\.\*\.mlp\.experts\.gate_up_proj +16 host' 'predicted tok/s +[0-9.]+ +[0-9.]+' \
    'bytes over PCIe per token +0 B +2\.[2-5][0-9] GB' 'weights read in place over PCIe +2\.[2-5][0-9] GB' \
    'longer than all on GPU'; do
    printf '%s\n' "$out" | grep -Eq "$pat" || { echo "FAIL: demo output lacks /$pat/"; fails=$((fails + 1)); }
done
[ "$st" = 0 ] || { echo "FAIL: woffload demo --replay exited $st"; fails=$((fails + 1)); }
man=$(WO_EXPERT_BUDGET=9GiB "$woffload" demo --replay --policy "$(dirname "$0")/../examples/moe-experts-managed.yaml" 2>&1)
printf '%s\n' "$man" | grep -Eq 'bytes over PCIe per token +0 B +[0-9.]+ MB' ||
    { echo "FAIL: managed demo does not move megabytes a token"; fails=$((fails + 1)); }
# a bad trace path is one clear line, not a crash
bad=$("$woffload" demo --replay --trace /nonexistent/x.wot.gz 2>&1)
[ $? != 0 ] && printf '%s\n' "$bad" | grep -q 'x.wot.gz' ||
    { echo "FAIL: a missing trace: $bad"; fails=$((fails + 1)); }
[ "$fails" = 0 ] && echo "ok: demo" || printf '%s\n' "$out" | head -40
exit $((fails > 0))
