#!/bin/sh
# tests/test-replay-tool.sh: woffload-replay as a user meets it: a good
# trace (report, timeline JSON, model file), the same trace gzip-compressed,
# and truncated, bit-flipped and missing traces, bad options and bad model files, each with a clear message
# and exit status 2, never a crash.
# usage: test-replay-tool.sh WOFFLOAD_REPLAY GEN_TRACE EXAMPLES_DIR [CORPUS_DIR]
set -u
replay=$1
gen=$2
examples=$3
corpus=${4:-}
. "$(dirname "$0")/expect-lib.sh"

"$gen" "$dir/t.wot" --layers 4 --experts 16 --topk 2 --steps 40 --expert-mib 8 || exit 1

expect 0 'step time: +[0-9.]+ ms predicted' -- "$replay" "$dir/t.wot" --budget 50% --timeline "$dir/tl.json"
expect 0 'lower bound on any schedule' -- "$replay" "$dir/t.wot" --budget 50%
expect 0 'mlp\.experts\.gate_up_proj +managed' -- "$replay" "$dir/t.wot" --budget 50%
expect 0 'prefetcher off' -- "$replay" "$dir/t.wot" --no-prefetch
expect 0 'budget 64\.0 MB|budget 67\.1 MB' -- "$replay" "$dir/t.wot" --budget 64MiB
if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
assert any(e.get("tid") == 1 and e.get("ph") == "X" for e in ev), "no kernels"
assert any(e.get("tid") == 2 and e.get("name", "").startswith("prefetch") for e in ev), "no prefetches"
' "$dir/tl.json" || fail "timeline is not the expected Chrome trace JSON"
fi

# placements from a policy: the example's experts rule, its ${WO_EXPERT_BUDGET}
# device budget (a share of the device's memory)
WO_EXPERT_BUDGET=1% expect 0 'gate_up_proj +managed' -- "$replay" "$dir/t.wot" --policy "$examples/moe-experts-managed.yaml"
WO_EXPERT_BUDGET=1% expect 0 'budget 850\.3 MB' -- "$replay" "$dir/t.wot" --policy "$examples/moe-experts-managed.yaml"
expect 0 'gate_up_proj +device' -- "$replay" "$dir/t.wot" --policy "$examples/empty.yaml"
printf 'version: 1\nrules:\n  - match: experts\n    place: sideways\n' >"$dir/bad.yaml"
expect 2 'the policy did not load' -- "$replay" "$dir/t.wot" --policy "$dir/bad.yaml"

# the committed calibration of the lent H100 loads
expect 0 'device model: +woffload-calibrate: NVIDIA H100' -- "$replay" "$dir/t.wot" --device "$examples/../tools/models/h100.model"

# a model file changes the prediction; a bad one is refused with its line
cat >"$dir/slow.model" <<EOF
# a much slower link
zc_gbs = 5
EOF
fast=$("$replay" "$dir/t.wot" --no-prefetch | sed -n 's/^step time: *\([0-9.]*\) ms.*/\1/p')
slow=$("$replay" "$dir/t.wot" --no-prefetch --device "$dir/slow.model" | sed -n 's/^step time: *\([0-9.]*\) ms.*/\1/p')
awk -v f="$fast" -v s="$slow" 'BEGIN { exit !(s > 3 * f) }' || fail "zc_gbs = 5 did not slow the host reads ($fast -> $slow ms)"
printf 'hbm_gbs = 2000\nbogus = 1\n' >"$dir/bad.model"
expect 2 'bad\.model:2: unknown key "bogus"' -- "$replay" "$dir/t.wot" --device "$dir/bad.model"

# a gzip-compressed trace replays as the plain one does (read as it is)
gzip -9c "$dir/t.wot" >"$dir/t.wot.gz"
plain=$("$replay" "$dir/t.wot" --budget 50% | tail -n +2)
gz=$("$replay" "$dir/t.wot.gz" --budget 50% | tail -n +2)
[ -n "$plain" ] && [ "$plain" = "$gz" ] || fail "t.wot.gz replays unlike t.wot"
zsize=$(wc -c <"$dir/t.wot.gz")
head -c $((zsize / 2)) "$dir/t.wot.gz" >"$dir/trunc.wot.gz"
expect 2 'trunc\.wot\.gz: corrupt or truncated at byte offset [0-9]+: .*truncated gzip data' -- "$replay" "$dir/trunc.wot.gz"

# truncated in the middle of a record, and a flipped bit: the offset is named
size=$(wc -c <"$dir/t.wot")
head -c $((size / 2 + 3)) "$dir/t.wot" >"$dir/trunc.wot"
expect 2 'corrupt or truncated at byte offset [0-9]+' -- "$replay" "$dir/trunc.wot"
python3 - "$dir/t.wot" "$dir/flip.wot" <<'EOF' || cp "$dir/t.wot" "$dir/flip.wot"
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
b[len(b) // 3] ^= 0x10
open(sys.argv[2], 'wb').write(b)
EOF
expect 2 'corrupt or truncated at byte offset [0-9]+' -- "$replay" "$dir/flip.wot"
head -c 10 "$dir/t.wot" >"$dir/short.wot"
expect 2 'corrupt or truncated at byte offset [0-9]+: .*prelude' -- "$replay" "$dir/short.wot"
expect 2 'No such file' -- "$replay" "$dir/missing.wot"

# usage errors
expect 2 'unknown option --frobnicate' -- "$replay" "$dir/t.wot" --frobnicate
expect 2 'a share wants 0 < PCT <= 100' -- "$replay" "$dir/t.wot" --budget 250%
expect 2 'want bytes' -- "$replay" "$dir/t.wot" --budget lots
expect 2 '--check wants a non-negative number' -- "$replay" "$dir/t.wot" --check x
expect 2 'usage' -- "$replay"
# the host speed: scaled, calibrated on the all-GPU decode step, misuse
expect 0 'host speed: +the engine.s own work 2\.000x' -- "$replay" "$dir/t.wot" --host-scale 2
expect 0 'decode step: +[0-9.]+ ms predicted, mean of [0-9]+ decode steps' -- "$replay" "$dir/t.wot" --budget 50%
expect 2 '--host-scale wants a positive number up to 20' -- "$replay" "$dir/t.wot" --host-scale 0
expect 2 '--host-step wants a positive number \(milliseconds\)' -- "$replay" "$dir/t.wot" --host-step -3
expect 2 'both set the host speed' -- "$replay" "$dir/t.wot" --host-scale 2 --host-step 9
expect 2 'no host speed in 0\.05x-20x' -- "$replay" "$dir/t.wot" --host-step 0.000001

# a trace without a period: nothing to measure, said plainly
"$gen" "$dir/one.wot" --layers 2 --experts 4 --topk 1 --steps 1 --expert-mib 2 || exit 1
expect 2 'no repeating step' -- "$replay" "$dir/one.wot"
expect 77 'check: +skipped' -- "$replay" "$dir/one.wot" --check 1.25

# the trace reader's corpus (valid, corrupt and odd traces): a report or a
# clear refusal, never a crash
if [ -n "$corpus" ] && [ -d "$corpus" ]; then
    for f in "$corpus"/*; do
        "$replay" "$f" --budget 50% >"$dir/out" 2>&1
        st=$?
        if [ "$st" -ne 0 ] && [ "$st" -ne 2 ]; then
            fail "$f: exit status $st (a crash?)"
            tail -3 "$dir/out" | sed 's/^/    /'
        fi
    done
fi

finish
