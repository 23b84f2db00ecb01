#!/bin/sh
# tests/gpu/test-llamacpp-gpu.sh WOFFLOAD-RUN SRCDIR: llama.cpp under the shim
# with the ggml hook, on the GPU (suite 'gpu'). Greedy token ids from
# bench/llamacpp-tokens.c (built against a llama.cpp tree, as
# bench/llamacpp-hook.sh builds it) must equal the plain run's:
#   - experts on the host by GGUF name (examples/llamacpp-ot-exps-cpu.yaml);
#   - the first 8 layers' experts on the host (llamacpp-n-cpu-moe.yaml);
#   - experts on the host, late bound (WOFFLOAD_LATE_BIND=1: the model
#     buffer is a VMM range re-backed at seal, docs/placement.md);
#   - experts on the host staged into device slots every step
#     (llamacpp-exps-stream.yaml, llama.cpp's CUDA graphs off so that its
#     launches can be redirected: each expert tensor a sub-span of the model
#     buffer; WOFFLOAD_GGML_STREAM=0: no claims to read in place); the stats
#     must show launches redirected;
#   - the same with llama.cpp's CUDA graphs on (its default): each graph
#     launch replayed kernel by kernel (preload/graph-replay.c), its
#     launches redirected; the stats must count replays;
#   - the same, graphs on, with 32 sequences decoded side by side (their
#     ids against a plain run of the 32): the claims (the default) leave
#     every step to the executor, and llama.cpp's batched graph (which
#     allocates cuBLAS's workspace inside the graph) is replayed;
#     (the hook's departure lag of one range: each slot reused as soon as
#     the engine left its range, docs/prefetch.md, Departure fences; the
#     stats' departure_lag 1);
#   - the same with WOFFLOAD_DEPARTURE_LAG=2, which wins over the hook's
#     word: tokens identical, the stats' departure_lag 2;
#   - experts on the host, 32 sequences, every compute's router picks
#     registered (WOFFLOAD_GGML_PICKS_FROM=1, WOFFLOAD_GGML_STREAM=100) and
#     copied on the copy engine (WOFFLOAD_PICKS_ENGINE=50, off by default) (uvm/picks-dma.c) from pinned mirrors of the
#     model buffer's expert tensors, the decode graphs replayed for it; the
#     stats must count copies on the copy engine, mirrors made, replays,
#     and no kernel fallback;
#   - experts on the host with 9 GiB of hot experts (llamacpp-exps-hot.yaml,
#     WOFFLOAD_PICKS_HOT=9216): every compute's picks registered, a single
#     token's too (the hook's default with hot experts), the decode graphs
#     replayed for it; the stats must count registrations in the decode
#     steps (more than 8 a tensor) and rows served by the hot sets;
#   - the same on the copy engine (WOFFLOAD_PICKS_ENGINE=10: every compute
#     here, a token's 12% of the experts too): the kernels copy the hot
#     rows, the copy engine the others; the stats must count copies on the
#     copy engine after the sets are made as well (more than 2 for each
#     tensor whose pinned mirror was made: the copy engine's source);
#   - the same with the ggml hook's claims (the default): every compute here
#     (a 16-token prompt, 88% of 32 experts top-4 picked, then one token at
#     a time) claims the experts read in place, so nothing is staged and the
#     claims are counted;
# and the live stats must place every `_exps` tensor on the host.
#   - under `--fit 90%` beside a blocker process leaving half the GGUF's
#     bytes free, with and without late binding: tokens identical, the
#     process's device peak within 1.05x the fit size, no more managed
#     memory than was free, weights on the device at least 0.9x fit's
#     budget (the hook splits the model buffer by tensor under fit: one
#     buffer of 19.5 GiB was pinned whole by the cap, 0 B on the device),
#     and where NVML loads, the process's contexts out of fit's size (64 MiB
#     to 4 GiB) (block_row, below);
#   - with LLAMA_BENCH (llama-batched-bench), 32 sequences under it with
#     the copy engine on: it must end with exit status 0 (it hung before
#     the gate, uvm.h wo_uvm_quiesce_begin, and ended in SIGSEGV when its
#     exit freed a tensor the mirror thread was reading), with copies on the
#     copy engine and no free past the gate's wait;
# LLAMACPP_GPU_BIND_COPIES=1 adds two rows, late bound with
# WOFFLOAD_BIND_COPIES=1 (experimental: the bound range's host experts
# copied picked, and staged, from the range itself; both failed on the H200
# before the gate was held through re-backing): exps-host-late-copies and
# exps-stream-late-copies. LLAMACPP_GPU_ROWS (comma-separated names) runs
# only those rows (and no blocker or bench rows unless named).
# Needs LLAMA_TOKENS (the llamacpp-tokens program) and LLAMA_GGUF (a MoE
# GGUF, e.g. the peers kit's gen_gguf.py output); without them: skipped (77).
set -u
run=$1
src=$2
tok=${LLAMA_TOKENS:-}
gguf=${LLAMA_GGUF:-}
if [ -z "$tok" ] || [ -z "$gguf" ] || [ ! -x "$tok" ] || [ ! -f "$gguf" ]; then
    echo "SKIP: set LLAMA_TOKENS (bench/llamacpp-tokens.c, built) and LLAMA_GGUF (a MoE GGUF)"
    exit 77
fi
tmp=$(mktemp -d /tmp/wo-llamacpp-gpu-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0

plain=$("$tok" "$gguf" 32 mmap 2>"$tmp/plain.err" | grep -m1 '^tokens:')
if [ -z "$plain" ]; then
    echo "FAIL: the plain run gave no tokens"
    tail -5 "$tmp/plain.err"
    exit 1
fi
echo "plain: $plain"
plain32=$("$tok" "$gguf" 32 mmap 32 2>"$tmp/plain32.err" | grep -m1 '^tokens:')
if [ -z "$plain32" ]; then
    echo "FAIL: the plain run of 32 sequences gave no tokens"
    tail -5 "$tmp/plain32.err"
    exit 1
fi
seqs=1

# row NAME POLICY [VAR=VALUE...]
# LLAMACPP_GPU_ROWS: is row $1 to run
wanted() {
    [ -z "${LLAMACPP_GPU_ROWS:-}" ] && return 0
    case ",$LLAMACPP_GPU_ROWS," in *",$1,"*) return 0 ;; esac
    return 1
}
row() {
    name=$1 pol=$2
    shift 2
    wanted "$name" || return 0
    env "$@" WO_TOKENS_STATS="$tmp/$name.json" "$run" --policy "$src/examples/$pol" --log info -- \
        "$tok" "$gguf" 32 mmap "$seqs" >"$tmp/$name.out" 2>"$tmp/$name.err"
    got=$(grep -m1 '^tokens:' "$tmp/$name.out")
    want=$plain
    [ "$seqs" -gt 1 ] && want=$plain32
    if [ "$got" != "$want" ]; then
        echo "FAIL $name: tokens ${got:-none}, plain $want"
        tail -8 "$tmp/$name.err"
        # what was placed, late bound and picked, for the record
        python3 - "$tmp/$name.json" <<'PY' || true
import json, sys
st = json.load(open(sys.argv[1]))
pk = st.get("picks", {})
print(f"    late_bind {st.get('late_bind')}; picks: registrations {pk.get('registrations')}, "
      f"staged {pk.get('staged')}, reused {pk.get('reused')}, failed {pk.get('failed')}, "
      f"captured {pk.get('captured')}, buffers {pk.get('buffer_bytes')} B")
PY
        fails=$((fails + 1))
        return
    fi
    if ! python3 - "$tmp/$name.json" "$pol" "$name" <<'PY'; then
import json, sys
st = json.load(open(sys.argv[1]))
exps = [n for n in st.get("names", []) if n["name"].endswith("_exps.weight")]
want_all = any(p in sys.argv[2] for p in ("ot-exps", "exps-stream", "exps-hot"))
host = [n for n in exps if n["placement"] == "host"]
sx = st.get("stream", {})
print(f"    {len(exps)} _exps tensors named, {len(host)} on the host; late_bind {st.get('late_bind')}; "
      f"stream: {sx.get('sub_spans')} sub-spans, {sx.get('redirected')} launches redirected, "
      f"{sx.get('staged')} staging copies")
ip = st.get("interpose", {})
if sys.argv[3].startswith("exps-replay"):
    print(f"    graph launches replayed {ip.get('graph_replays')} ({ip.get('graph_replay_kernels')} "
          f"kernels), graphs read {ip.get('graph_snapshots')} "
          f"({ip.get('graph_snapshot_unsupported')} not replayable)")
eng = st.get("picks", {}).get("engine", {})
if "engine" in sys.argv[3]:
    print(f"    picks on the copy engine: {eng.get('copies')} copies in {eng.get('runs')} runs "
          f"({eng.get('bytes', 0) / 1e9:.2f} GB), {eng.get('mirrors')} mirrors, "
          f"{eng.get('kernel_fallbacks')} kernel fallbacks, {eng.get('no_slot')} without a slot; "
          f"graph launches replayed {ip.get('graph_replays')}")
if sys.argv[3].startswith("exps-engine"):
    if not (eng.get("copies", 0) > 0 and eng.get("mirrors", 0) > 0 and
            eng.get("kernel_fallbacks", 1) == 0 and ip.get("graph_replays", 0) > 0):
        sys.exit(1)
if sys.argv[3] == "exps-host-late-copies":
    pk = st.get("picks", {})
    print(f"    picks from the bound range: {pk.get('staged')} copies, {pk.get('failed')} failed")
    if not pk.get("staged", 0) > 0:
        sys.exit(1)
if sys.argv[3].startswith("exps-hot"):
    pk = st.get("picks", {})
    print(f"    picks: {pk.get('registrations')} registrations, {pk.get('staged')} copies, "
          f"{pk.get('failed')} failed, {pk.get('hot_bytes', 0) / 2**30:.2f} GiB hot, "
          f"{pk.get('hot_rows')} rows from the hot sets; graph launches replayed "
          f"{ip.get('graph_replays')}")
    # -engine: copies on the copy engine once the sets are made too. Only a
    # tensor with its pinned mirror made copies there (the mirrors come
    # seconds into the run: on an H100, 10 of 48 in this run's 32 steps,
    # and 198 copies), and its first 2 registrations come before its set:
    # more copies than 2 a mirror
    if not (pk.get("registrations", 0) > 8 * len(exps) and pk.get("hot_rows", 0) > 0 and
            pk.get("failed", 1) == 0 and
            (not sys.argv[3].endswith("-engine") or
             eng.get("copies", 0) > max(2 * eng.get("mirrors", 0), 0))):
        sys.exit(1)
if sys.argv[3] == "exps-claims":
    print(f"    claims {sx.get('inplace_claims')}, launches read a claimed range in place "
          f"{sx.get('inplace_claimed')}")
    streamed = sx.get("inplace_claims", 0) > 0 and sx.get("staged", 0) == 0
else:
    streamed = "exps-stream" not in sys.argv[2] or (sx.get("sub_spans", 0) > 0 and
                                                    sx.get("redirected", 0) > 0)
    if sys.argv[3].startswith("exps-replay"):
        streamed = streamed and ip.get("graph_replays", 0) > 0
    if sys.argv[3].startswith("exps-replay-b32"):
        # the run had the lag (the stats say it): one, the hook's word
        # (woffload_departure_lag), or two where WOFFLOAD_DEPARTURE_LAG=2
        # wins; and its slots were reused against their departure fences
        lag = 2 if sys.argv[3].endswith("-lag2") else 1
        print(f"    departure lag {sx.get('departure_lag')}: slots reused after a departure fence "
              f"{sx.get('fences_departed')}, at the tail {sx.get('fences_at_reuse')}")
        streamed = (streamed and sx.get("departure_lag") == lag and
                    sx.get("fences_departed", 0) > (sx.get("fences_at_reuse", 0) if lag == 1 else 0))
sys.exit(0 if exps and streamed and (len(host) == len(exps) if want_all else 0 < len(host) < len(exps)) else 1)
PY
        echo "FAIL $name: the stats do not place (or stream) the experts as the policy says"
        grep -m8 -e 'graph replay' -e 'error' "$tmp/$name.err"
        fails=$((fails + 1))
        return
    fi
    echo "ok   $name: tokens identical to plain"
}

row exps-host llamacpp-ot-exps-cpu.yaml
row n-cpu-moe llamacpp-n-cpu-moe.yaml
row exps-host-late llamacpp-ot-exps-cpu.yaml WOFFLOAD_LATE_BIND=1
if [ "${LLAMACPP_GPU_BIND_COPIES:-0}" = 1 ]; then
    row exps-host-late-copies llamacpp-ot-exps-cpu.yaml WOFFLOAD_LATE_BIND=1 WOFFLOAD_BIND_COPIES=1
    row exps-stream-late-copies llamacpp-exps-stream.yaml GGML_CUDA_DISABLE_GRAPHS=1 \
        WOFFLOAD_GGML_STREAM=0 WOFFLOAD_LATE_BIND=1 WOFFLOAD_BIND_COPIES=1
fi
row exps-stream llamacpp-exps-stream.yaml GGML_CUDA_DISABLE_GRAPHS=1 WOFFLOAD_GGML_STREAM=0
row exps-hot llamacpp-exps-hot.yaml WOFFLOAD_PICKS_HOT=9216
row exps-hot-engine llamacpp-exps-hot.yaml WOFFLOAD_PICKS_HOT=9216 WOFFLOAD_PICKS_ENGINE=10
row exps-replay llamacpp-exps-stream.yaml WOFFLOAD_GGML_STREAM=0
seqs=32
row exps-replay-b32 llamacpp-exps-stream.yaml
row exps-replay-b32-lag2 llamacpp-exps-stream.yaml WOFFLOAD_DEPARTURE_LAG=2
row exps-engine-b32 llamacpp-ot-exps-cpu.yaml WOFFLOAD_GGML_PICKS_FROM=1 WOFFLOAD_GGML_STREAM=100 WOFFLOAD_PICKS_ENGINE=50
seqs=1
row exps-claims llamacpp-exps-stream.yaml GGML_CUDA_DISABLE_GRAPHS=1

# A model larger than the free device memory (issue 41): bench/blocker.py,
# another process, holds device memory so that PCT% of the GGUF's bytes stay
# free, and the tokens program runs under `woffload-run --fit 90%
# --keep-free 1GiB`. Checks: tokens identical to plain; never more managed
# memory asked for than was free (the managed cap's least headroom >= 0, its
# peak below the free memory); the process's device peak (the blocker
# samples the free memory every 5 ms: everything the tokens program held,
# context included) at most 1.05x the fit size, the free memory less
# keep_free. block_row NAME PCT [VAR=VALUE...]
block_row() {
    name=$1 pct=$2
    shift 2
    wanted "$name" || return 0
    leave=$(($(stat -c %s "$gguf") * pct / 100))
    python3 "$src/bench/blocker.py" --leave "$leave" >"$tmp/$name.blocker" 2>&1 &
    bpid=$!
    w=0
    while ! grep -q '^holds' "$tmp/$name.blocker" && kill -0 $bpid 2>/dev/null && [ $w -lt 120 ]; do
        sleep 0.5
        w=$((w + 1))
    done
    if ! grep -q '^holds' "$tmp/$name.blocker"; then
        echo "FAIL $name: the blocker did not start"
        cat "$tmp/$name.blocker"
        kill $bpid 2>/dev/null
        fails=$((fails + 1))
        return
    fi
    env "$@" WO_TOKENS_STATS="$tmp/$name.json" "$run" --fit 90% --keep-free 1GiB --log info -- \
        "$tok" "$gguf" 32 mmap 1 >"$tmp/$name.out" 2>"$tmp/$name.err"
    kill -TERM $bpid
    wait $bpid
    got=$(grep -m1 '^tokens:' "$tmp/$name.out")
    if [ "$got" != "$plain" ]; then
        echo "FAIL $name: tokens ${got:-none}, plain $plain"
        tail -8 "$tmp/$name.err"
        fails=$((fails + 1))
        return
    fi
    if ! env "$@" python3 - "$tmp/$name.json" "$tmp/$name.blocker" <<'PY'; then
import json, os, re, sys
st = json.load(open(sys.argv[1]))
line = open(sys.argv[2]).read()
m = re.search(r"free at start (\d+) B, least free (\d+) B, peak used by others (\d+) B", line)
if not m:
    print(f"    the blocker said no peak: {line.strip()[-300:]}")
    sys.exit(1)
free, peak = int(m.group(1)), int(m.group(3))
size = free - (1 << 30)  # --keep-free 1GiB: the fit size under the blocker
cap, fit, lb = st.get("managed_cap") or {}, st.get("fit") or {}, st.get("late_bind") or {}
pl = st.get("placements") or {}
gib = lambda x: f"{(x or 0) / 2**30:.2f} GiB"
print(f"    free {gib(free)}, fit size {gib(size)}, process peak {gib(peak)} ({peak / size:.2f}x); "
      f"fit budget {gib(fit.get('budget'))}, weights on the device {gib(fit.get('device_bytes'))}, "
      f"engine {gib(fit.get('engine_bytes'))}; placed device {gib((pl.get('device') or {}).get('bytes'))}, "
      f"host {gib((pl.get('host') or {}).get('bytes'))}, managed {gib((pl.get('managed') or {}).get('bytes'))}; "
      f"managed cap: least headroom {cap.get('min_headroom')} B over {cap.get('checks')} checks, "
      f"peak {gib(cap.get('peak'))}, pinned {gib(cap.get('pinned_bytes'))}; late_bind ranges {lb.get('ranges')}; "
      f"the process's contexts {gib(fit.get('context_bytes'))}")
# where the machine has NVML, fit took the process's contexts out of its
# size: a context and its modules, not a wrong layout's figure
try:
    import ctypes
    ctypes.CDLL("libnvidia-ml.so.1")
    nvml = True
except OSError:
    nvml = False
if nvml and not fit.get("context_known"):
    print("    note: NVML loads but fit could not tell the contexts (the seal line says why)")
elif nvml and not (64 << 20) <= fit.get("context_bytes", 0) <= (4 << 30):
    print(f"    fit's contexts {fit.get('context_bytes')} B: not between 64 MiB and 4 GiB though NVML loads")
    sys.exit(1)
# fit uses the device: the model buffer split by tensor (the ggml hook's
# default under fit) or late bound, fit's choice reaches the device; one
# buffer (WOFFLOAD_GGML_SPLIT=0) is pinned whole by the cap (0 B there)
one = os.environ.get("WOFFLOAD_GGML_SPLIT") == "0" and os.environ.get("WOFFLOAD_LATE_BIND") != "1"
used = (fit.get("device_bytes") or 0) >= 0.9 * (fit.get("budget") or 0)
if not one and not used:
    print(f"    weights on the device {gib(fit.get('device_bytes'))}: under 0.9x fit's budget")
ok = (peak <= 1.05 * size and cap.get("peak", 1 << 62) < free and (one or used) and
      # min_headroom is null when no managed allocation was served (the
      # 19.5 GiB model buffer, past the cap, was served as host memory)
      (cap.get("min_headroom") is None or cap["min_headroom"] >= 0) and fit.get("budget") is not None)
sys.exit(0 if ok else 1)
PY
        echo "FAIL $name: over the fit size, or more managed memory than was free"
        grep -m8 -e 'managed cap' -e 'fit:' -e 'error' "$tmp/$name.err"
        fails=$((fails + 1))
        return
    fi
    echo "ok   $name: tokens identical to plain, within the fit size"
}

block_row fit-block50 50
block_row fit-block50-late 50 WOFFLOAD_LATE_BIND=1

# The copy engine under llama-batched-bench (LLAMA_BENCH: its binary), whose
# first step frees memory while copies are queued: without the gate
# (wo_uvm_quiesce_begin) it hung there on the H200. It must end within 150 s,
# with copies on the copy engine and no free past the gate's wait.
bench=${LLAMA_BENCH:-}
if ! wanted engine-bench-b32; then
    :
elif [ -n "$bench" ] && [ -x "$bench" ]; then
    name=engine-bench-b32
    timeout -k 10 150 env WOFFLOAD_GGML_PICKS_FROM=1 WOFFLOAD_GGML_STREAM=100 \
        WOFFLOAD_PICKS_ENGINE=50 "$run" --policy "$src/examples/llamacpp-ot-exps-cpu.yaml" \
        --stats "$tmp/$name.json" --log info -- "$bench" -m "$gguf" -ngl 99 -fa on -npp 32 \
        -ntg 8 -c 4096 -npl 32 >"$tmp/$name.out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "FAIL $name: exit $rc (124: it hung)"
        grep -m8 -e 'woffload: ' -e 'error' "$tmp/$name.out"
        # the copy engine's stall report: which driver call held it off
        grep -e 'looks stuck' "$tmp/$name.out"
        tail -5 "$tmp/$name.out"
        fails=$((fails + 1))
    elif ! python3 - "$tmp/$name.json" <<'PY'; then
import json, sys
eng = json.load(open(sys.argv[1])).get("picks", {}).get("engine", {})
print(f"    picks on the copy engine: {eng.get('copies')} copies, {eng.get('mirrors')} mirrors "
      f"({eng.get('mirrors_dropped')} dropped for a free), "
      f"{eng.get('quiesced')} launches left to the kernel while a free drained the queue, "
      f"{eng.get('quiesce_timeouts')} frees past the gate's wait, {eng.get('stalls')} stall reports")
sys.exit(0 if eng.get("copies", 0) > 0 and eng.get("quiesce_timeouts", 1) == 0 else 1)
PY
        echo "FAIL $name: no copies on the copy engine, or a free went on past the gate"
        fails=$((fails + 1))
    else
        grep -E '^\|  *32 \|' "$tmp/$name.out" | sed 's/^/    /'
        echo "ok   $name: llama-batched-bench ran to its end with the copy engine on"
    fi
else
    echo "skip engine-bench-b32: LLAMA_BENCH (llama-batched-bench) not set"
fi
[ "$fails" -eq 0 ] || exit 1
echo "PASS"
