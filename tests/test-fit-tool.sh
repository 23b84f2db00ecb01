#!/bin/sh
# tests/test-fit-tool.sh: `woffload-policy fit` on a recorded run
# (tests/traces/h200-cb-moe32-uniform-gpu.wot.gz: a 16-layer MoE, 19.7 GiB of
# weights, 18.0 GiB of them experts, 18.35 GiB of the engine's own device
# memory): the policy it writes passes `check`; with a budget smaller than
# the experts, experts go to the host and attention and norms stay; its
# predicted step time is within 10% of (or better than) the best of three
# hand-written policies at the same budget (tests/fit/), each replayed by
# woffload-replay; every bad input exits 2 naming the option or file.
# usage: test-fit-tool.sh WOFFLOAD_POLICY WOFFLOAD_REPLAY SOURCE_ROOT
set -u
tool=$1
replay=$2
root=$3
trace=$root/tests/traces/h200-cb-moe32-uniform-gpu.wot.gz
model=$root/tools/models/h100.model
. "$(dirname "$0")/expect-lib.sh"

# --- a policy that checks, chosen by reads per step -------------------------
expect 0 'fit: predicted step time [0-9.]+ ms' -- "$tool" fit --trace "$trace" --device 30GiB --model "$model" -o "$dir/p30.yaml"
grep -Eq 'all on GPU [0-9.]+ ms' "$dir/out" || fail "no all-on-GPU step time"
grep -Eq 'offloaded-bytes bound: [0-9.]+ ms' "$dir/out" || fail "no offloaded-bytes bound"
# the other choices at the same budget, each replayed; reads per step never
# predicts slower than the kind of tensor alone or experts-host (the same
# reads per step spread tensor by tensor, WOFFLOAD_FIT_LAYERS=0, is the other
# unit of the same choice, whole layers being the default: either may be faster)
for c in 'by reads per step \(this policy\)' 'by the kind of tensor only' 'by reads per step, tensor by tensor' \
    'experts on the host, the rest device'; do
    grep -Eq "^fit:   $c .* [0-9.]+ ms; [0-9.]+ [KMG]iB" "$dir/out" || fail "no predicted step for the choice '$c'"
done
awk '/^fit:   / && match($0, /[0-9.]+ ms;/) { t = substr($0, RSTART, RLENGTH - 4) + 0
         if ($0 ~ /by reads per step \(this policy\)/) v = t
         else if ($0 !~ /over the budget/ && $0 !~ /by reads per step,/ && (min == "" || t < min)) min = t }
     END { exit !(v != "" && min != "" && v <= min * 1.001) }' "$dir/out" ||
    { fail "fit by reads per step predicts slower than another choice"; grep '^fit:   ' "$dir/out"; }
expect 0 'ok' -- "$tool" check "$dir/p30.yaml"
grep -q '^default: host$' "$dir/p30.yaml" || fail "the rest is not the default (host)"
grep -q '^# budget for weights: 11.65 GiB' "$dir/p30.yaml" || { fail "budget header"; head -5 "$dir/p30.yaml"; }
# to stdout, the same text; deterministic
"$tool" fit --trace "$trace" --device 30GiB --model "$model" >"$dir/p30b.yaml" 2>/dev/null || fail "stdout run"
cmp -s "$dir/p30.yaml" "$dir/p30b.yaml" || fail "fit is not deterministic (or -o differs from stdout)"

# --- the process's contexts (--context; else the trace's INFO context_bytes,
# which this trace predates) come out of --device as the engine's own do
expect 0 'fit: budget 10.65 GiB for weights .*1.00 GiB of it the process.s contexts: --context' -- \
    "$tool" fit --trace "$trace" --device 30GiB --context 1GiB --model "$model" -o "$dir/c.yaml"
grep -q '^# budget for weights: 10.65 GiB (device 30.00 GiB of 79.18 GiB, less the engine.s own 19.35 GiB, 1.00 GiB of it' "$dir/c.yaml" ||
    { fail "--context: budget header"; head -3 "$dir/c.yaml"; }
grep -q '^# written by: .* --context 1GiB' "$dir/c.yaml" || fail "--context not in the written-by line"

# --- monotone (issue 41): more device memory never predicts a slower step
prev=
for dev in 20GiB 24GiB 28GiB 32GiB 36GiB 40GiB; do
    "$tool" fit --trace "$trace" --device $dev --model "$model" -o "$dir/m.yaml" 2>"$dir/m.err" ||
        fail "fit --device $dev"
    t=$(sed -n 's/^fit: predicted step time \([0-9.]*\) ms.*/\1/p' "$dir/m.err")
    [ -n "$t" ] || fail "fit --device $dev: no predicted step time"
    if [ -n "$prev" ] && [ -n "$t" ] && awk -v a="$t" -v b="$prev" 'BEGIN { exit !(a > b * 1.001) }'; then
        fail "fit --device $dev predicts $t ms, slower than $prev ms with less memory"
    fi
    prev=$t
done

# --- budget smaller than the experts: experts to the host, attention and norms stay
for dev in 30GiB 22GiB; do
    "$tool" fit --trace "$trace" --device $dev --model "$model" -o "$dir/p.yaml" 2>/dev/null || fail "fit --device $dev"
    "$replay" "$trace" --policy "$dir/p.yaml" --device "$model" --top 1000 >"$dir/r.txt" 2>&1 || fail "replay of fit $dev"
    sed -n '/^  name /,$p' "$dir/r.txt" | awk 'NR > 1 { print $1, $2 }' >"$dir/places"
    grep -q '\.experts\..* host$' "$dir/places" || fail "$dev: no expert went to the host"
    if grep -E '(self_attn|norm|mlp\.gate\.weight).* host$' "$dir/places"; then
        fail "$dev: attention, norms or routers went to the host"
    fi
    # what went to the device fits the budget: device-placed bytes <= budget
    budget=$(sed -n 's/^# budget for weights: \([0-9.]*\) GiB.*/\1/p' "$dir/p.yaml")
    ondev=$(sed -n 's/^# on the device: [0-9]* names, \([0-9.]*\) GiB.*/\1/p' "$dir/p.yaml")
    awk -v b="$budget" -v d="$ondev" 'BEGIN { exit !(d <= b + 0.005) }' || fail "$dev: $ondev GiB on the device over the $budget GiB budget"
    echo "ok   --device $dev: experts offloaded, attention and norms kept; $ondev GiB within $budget GiB"
done

# --- within 10% of the best of three hand-written policies at the same budget
# The fit budget at --device 30GiB is 11.65 GiB of weights. The hand-written
# ones keep at most that on the device: experts host (1.74 GiB on the
# device), layers 8-15 host (about 10.2 GiB), experts managed with the
# budget less the 1.74 GiB of non-expert weights (9.9 GiB).
fit_ms=$("$tool" fit --trace "$trace" --device 30GiB --model "$model" 2>&1 >/dev/null |
    sed -n 's/^fit: predicted step time \([0-9.]*\) ms.*/\1/p')
best=
for p in experts-host late-layers-host experts-managed; do
    ms=$(WO_FIT_EXPERT_BUDGET=9.9GiB "$replay" "$trace" --policy "$root/tests/fit/hand-$p.yaml" --device "$model" |
        sed -n 's/^step time: *\([0-9.]*\) ms.*/\1/p')
    [ -n "$ms" ] || { fail "replay of hand-$p gave no step time"; continue; }
    echo "     hand-$p: $ms ms"
    if [ -z "$best" ] || awk -v a="$ms" -v b="$best" 'BEGIN { exit !(a < b) }'; then
        best=$ms
    fi
done
if [ -z "$fit_ms" ] || [ -z "$best" ]; then
    fail "no step times to compare (fit '$fit_ms', best '$best')"
elif awk -v f="$fit_ms" -v b="$best" 'BEGIN { exit !(f <= 1.10 * b) }'; then
    echo "ok   fit $fit_ms ms <= 1.10 x best hand-written $best ms"
else
    fail "fit $fit_ms ms is more than 1.10 x the best hand-written $best ms"
fi

# --- rest managed, percent, a base policy --------------------------------------
expect 0 'offloaded \(managed\)' -- "$tool" fit --trace "$trace" --device 40% --rest managed --model "$model" -o "$dir/pm.yaml"
grep -q '^default: managed$' "$dir/pm.yaml" || fail "--rest managed: default is not managed"
grep -Eq '^device_budget: [0-9]+$' "$dir/pm.yaml" || fail "--rest managed: no device_budget in bytes"
expect 0 'ok' -- "$tool" check "$dir/pm.yaml"
cat >"$dir/base.yaml" <<'EOF'
version: 1
rules:
  - name: embeddings-on-device
    match: embed_tokens
    place: device
  - name: head-host
    match: lm_head
    place: host
EOF
expect 0 'predicted step time' -- "$tool" fit --trace "$trace" --device 22GiB --policy "$dir/base.yaml" --model "$model" -o "$dir/pb.yaml"
expect 0 'ok' -- "$tool" check "$dir/pb.yaml"
"$replay" "$trace" --policy "$dir/pb.yaml" --device "$model" --top 1000 2>&1 | grep -E '^  (lm_head|model\.embed_tokens)' >"$dir/pb.txt"
grep -Eq 'lm_head\.weight +host' "$dir/pb.txt" || fail "--policy: the base's lm_head rule was not kept"
grep -Eq 'embed_tokens\.weight +device' "$dir/pb.txt" || fail "--policy: the base's embeddings rule was not kept"
# the base's rules come first
awk '/embeddings-on-device/ { e = NR } /fit-device/ { f = NR } END { exit !(e && f && e < f) }' "$dir/pb.yaml" ||
    fail "--policy: the base's rules are not first"

# --- bad input: exit 2, the option or file named -----------------------------
expect 2 "--device '20GX'.*expected a size" -- "$tool" fit --trace "$trace" --device 20GX
expect 2 "--context 'lots'.*expected a size" -- "$tool" fit --trace "$trace" --device 30GiB --context lots
expect 2 "--device '0'.*more than 0" -- "$tool" fit --trace "$trace" --device 0
expect 2 "--device '120%'" -- "$tool" fit --trace "$trace" --device 120%
expect 2 "--device '0%'" -- "$tool" fit --trace "$trace" --device 0%
expect 2 "--device '100GiB'.*more than the device has \(79.18 GiB" -- "$tool" fit --trace "$trace" --device 100GiB --model "$model"
expect 2 "--keep-free '30GiB'.*expected keep-free below device" -- "$tool" fit --trace "$trace" --device 30GiB --keep-free 30GiB
expect 2 "--keep-free '2XB'" -- "$tool" fit --trace "$trace" --device 30GiB --keep-free 2XB
expect 2 "--rest 'device': expected host or managed" -- "$tool" fit --trace "$trace" --device 30GiB --rest device
expect 2 "--trace is required|--trace T is required" -- "$tool" fit --device 30GiB
expect 2 "--device is required" -- "$tool" fit --trace "$trace"
expect 2 "unknown argument '--bogus'" -- "$tool" fit --trace "$trace" --device 30GiB --bogus
expect 2 "--trace $dir/missing.wot: No such file" -- "$tool" fit --trace "$dir/missing.wot" --device 30GiB
gzip -dc "$trace" | head -c 100000 >"$dir/cut.wot"
expect 2 "--trace $dir/cut.wot: corrupt or truncated at byte offset [0-9]+" -- "$tool" fit --trace "$dir/cut.wot" --device 30GiB
printf 'hbm_gbs = 2000\nbogus = 1\n' >"$dir/bad.model"
expect 2 "--model $dir/bad.model: .*bad\.model:2" -- "$tool" fit --trace "$trace" --device 30GiB --model "$dir/bad.model"
printf 'version: 1\nrules:\n  - match: experts\n    place: sideways\n' >"$dir/bad.yaml"
expect 2 "bad\.yaml:4:12: error: .*sideways" -- "$tool" fit --trace "$trace" --device 30GiB --policy "$dir/bad.yaml"
# a trace that names nothing: the recorded run without its TAG records (and
# without the footer, which counts them: read as a cut-short recording)
python3 - "$trace" "$dir/untagged.wot" <<'EOF' || fail "could not write the untagged trace"
import gzip, struct, sys
b = gzip.open(sys.argv[1]).read()
out, off = bytearray(b[:16]), 16
while off < len(b):
    (length,) = struct.unpack_from("<I", b, off)
    end = off + 8 + length + 4
    if b[off + 4] not in (0x04, 0x07):  # TAG, FOOTER
        out += b[off:end]
    off = end
open(sys.argv[2], "wb").write(out)
EOF
expect 2 "--trace $dir/untagged.wot: the trace names no tensors: record it with the Python hook" -- "$tool" fit --trace "$dir/untagged.wot" --device 30GiB

finish
