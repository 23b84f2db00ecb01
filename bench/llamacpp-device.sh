#!/usr/bin/env bash
# bench/llamacpp-device.sh: on the GPU machine, the steps of a session's
# llama.cpp work, each within one device call (600 s), the machine kept warm
# between calls (the next call within 30 s: /tmp/llb, the GGUFs and
# build-gpu survive only then).
#
#   WO_COMMIT=<commit> OUT=$OUT bash bench/llamacpp-device.sh STEP...
#   (carry [".peers", "build-yaml"], made by bench/llamacpp-kit.sh)
#
# Steps, in the order given:
#   shim           the shim alone in build-gpu, with its tests (about 1 min cold):
#                  enough for suite1 on a fresh machine
#   build          llama.cpp (llama-server, llama-batched-bench, libllama) in
#                  /tmp/llb, the moe32 GGUF /tmp/x.gguf and the shim in build-gpu, at
#                  once: about 5 min cold, nothing when they are there
#   build-bg       build in a process session of its own (nice 15), its log in
#                  /tmp/bgb.log, beside the next steps (`shim build-bg suite1`: the
#                  suite's first part, 254 s, hides llama.cpp's 300 s build; the
#                  prebuilt .peers/llb-bin.txz no longer travels with the tree,
#                  whose tracked files are 60 MB of the 64 MiB a call takes);
#                  build-wait waits for it (until 560 s into the call)
#   gguf128        the 128-expert GGUF /tmp/x-moe128.gguf (bench/gguf-shape.py);
#                  gguf128-bg starts it in the background (then `gguf128-bg build
#                  gguf128` makes both GGUFs and llama.cpp in about 280 s)
#   probe          bench/picked-copy.cu (about 1 min)
#   calibrate      woffload-calibrate (after shim; CALIBRATE_REPS [7]): this GPU's
#                  device model for woffload-replay, $OUT/calibrate.model
#   vmmprobe       bench/vmm-host-copy.cu (VMM_ROUNDS [10]): copies out of a range
#                  backed by host memory (late binding's), $OUT/vmm-host-copy.txt
#   uvmrelease     bench/uvm-release.cu (UVM_RELEASE_GIB [4]): whether a managed
#                  range prefetched to the host gives its device memory back, and
#                  what takes it back (fit's yields), $OUT/uvm-release.txt
#   pack           llama.cpp as build left it (/tmp/llb/bin and the CPU it was
#                  built for) as $OUT/llb-bin.txz, in 15 MiB parts when larger
#                  (llb-bin.txz.part-aa, -ab, ...: what comes back from $OUT is at
#                  most 16 MiB a file). Joined here into .peers/llb-bin.txz
#                  (cat parts > it) and carried, it saves a later session's build
#                  (bench/llamacpp-hook.sh: used on a machine whose CPU matches)
#   suite1         the gpu suite without llamacpp-gpu and stream-gpu
#   suite2         llamacpp-gpu and stream-gpu: the two together are the suite,
#                  recorded as $OUT/gpu-suite-{1,2}.txt; suite2a and suite2b run
#                  them one at a time ($OUT/gpu-suite-2a.txt, -2b). On the H200:
#                  llamacpp-gpu 163 s before its two blocker rows (about 50 s
#                  more), stream-gpu 458 s with its rows one after the other
#                  (now three at a time: not yet timed), so suite2 may fit one call
#   rows           bench/llamacpp-serve-rows.sh with ROWS, PARALLEL, ... from the
#                  environment (its header), GGUF /tmp/x.gguf unless set, into
#                  /tmp/rows, which the warm machine keeps between calls: a row of
#                  a later call checks its greedy ids against an earlier call's
#                  reference row (ROWS="shim-fit.2" after a call that ran
#                  llama-ncmoe8). Back in $OUT: this call's rows, its rows.md, and
#                  rows-all.md over every row in /tmp/rows (ROWS_FRESH=1 empties it
#                  first: do so when GGUF changes)
#   soak-start     issue 40's soak: one row (SOAK_ROW [shim-exps]) of
#                  bench/llamacpp-serve-rows.sh with SOAK_MINUTES [10] at SOAK_RATE
#                  [0.25] req/s (about 70% of the P=64 saturation measured on the
#                  moe32 GGUF), PARALLEL, in /tmp/soak, in a process session of its
#                  own: it outlives this call (one call ends at 600 s), then
#   soak-wait      (the next call, within 30 s) waits for it (at most until 560 s
#                  into the call: call it again if it is not done) and copies
#                  /tmp/soak to $OUT/soak
#   gputests       the gpu suite's tests GPU_TESTS (space-separated) alone, as
#                  $OUT/gpu-tests.txt (after shim: e.g. GPU_TESTS=bigload-gpu
#                  BIGLOAD_GPU_ROWS=fit-bind,fit, about 110 s; or GPU_TESTS=llamacpp-gpu
#                  LLAMACPP_GPU_BIND_COPIES=1 LLAMACPP_GPU_ROWS=exps-host-late,
#                  exps-host-late-copies,exps-stream-late-copies after build: late
#                  binding's copies, WOFFLOAD_BIND_COPIES, on llama.cpp)
#   streamrows     stream-gpu's rows STREAM_ROWS (space-separated) alone, STREAM_REPEAT
#                  [3] times one after the other, each run given STREAM_ROW_S [150] s
#                  (WO_STREAM_ROW_S: a hung row costs that, not the suite's 300), into
#                  $OUT/stream-rows.txt (after shim: a flaky row's rate, e.g.
#                  STREAM_ROWS=moe128-host-picks-engine-lazy)
#   hook           bench/llamacpp-hook.sh's rows HOOK_ROWS (its header: tokens-*,
#                  bench-* for llama-batched-bench b1/b8/b32, FIT, SHAPE), on what
#                  build left, into $OUT/hook
#   bigload        bench/bigload.py BIGLOAD_ARGS (e.g. "--shape moe128 --modes batched"),
#                  every row on cores BIGLOAD_CPUS [0-7];
#                  BIGLOAD_WITH_PREV=1 adds the rows of this machine's earlier
#                  bigload calls to the report (one report over several calls)
#                  with the shim in build-gpu, into $OUT/bigload, within the call's
#                  time left: issue 41's checkpoint larger than the free memory,
#                  loaded by from_pretrained beside a blocker (its checkpoint stays
#                  in /tmp for the next call)
#                  STALL_STACKS=1: the shim's log in $OUT/bigload/shim.log, and the
#                  first row the copy engine's watchdog reports stuck gets every
#                  thread's stack by bench/stall-stacks.sh, then is killed
#   e2e            bench/e2e.py's scenarios E2E_SCENARIOS (comma-separated) with
#                  the shim in build-gpu, into $OUT/e2e (--keep-going, within the
#                  call's time left; E2E_CPUS pins them as bench.md says), with
#                  the traces its trace-* scenarios recorded (NAME.wot.gz)
# Each step's output goes to $OUT/STEP.log (rows: $OUT/pP-ROW/); its last lines are
# printed. Only 8 files come back from a call: tar what a step leaves (TAR=1 does it
# for every folder in $OUT at the end).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${OUT:?OUT: where the results go}"
: "${WO_COMMIT:?WO_COMMIT: the commit this tree is (git metadata on the device can be stale)}"
export WO_COMMIT
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
pc=$ROOT/build-yaml/root/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$pc/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$pc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# llama.cpp's tree outside the carried one: a later call's copy of .peers
# replaces the folder under a build still running in the background
LSRC=/tmp/llama-src/llama
[ -d $LSRC ] || { [ -s .peers/llama.txz ] && mkdir -p /tmp/llama-src && tar xJf .peers/llama.txz -C /tmp/llama-src; }
mkdir -p "$OUT"
SUITE_B=(llamacpp-gpu stream-gpu)
# the gpu suite's tests less SUITE_B (the first of the two calls it takes)
suite_part1() {
    meson test -C build-gpu --setup gpu --suite gpu --list 2>/dev/null | sed 's/.*://' |
        grep -v -x -e "${SUITE_B[0]}" -e "${SUITE_B[1]}"
}
# This machine's kernel reads of host memory beside its copies, once a machine
# (/tmp/host-read.txt; test-placement-gpu at 256 MiB, a few seconds), into
# $OUT/host-read.txt by the steps whose rows read host memory in place (rows,
# hook, bigload): lent GPUs differ (most read at 92-94% of the H2D copy rate,
# one H100 at 59-62%), and rows from two machines compare only with it
host_read() {
    if [ ! -s /tmp/host-read.txt ] && [ -x build-gpu/tests/test-placement-gpu ]; then
        WO_GPU_TESTS=1 timeout 60 build-gpu/tests/test-placement-gpu --size $((256 << 20)) 2>&1 |
            grep -E '^GPU .*H2D copy|^This machine' >/tmp/host-read.txt
    fi
    cp /tmp/host-read.txt "$OUT/host-read.txt" 2>/dev/null && cat /tmp/host-read.txt
}
rc_all=0
for step in "$@"; do
    echo "[device $(el)s] $step"
    left=$((570 - $(el)))
    case $step in
    build)
        mkdir -p "$OUT/build"
        # the shim with its tests (the gpu suite's steps need them; llamacpp-hook.sh
        # alone would set build-gpu up without)
        [ -f build-gpu/build.ninja ] ||
            meson setup build-gpu -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}" >"$OUT/setup.log" 2>&1
        # the 32-expert GGUF /tmp/x.gguf, whatever SHAPE and GGUF the hook
        # step is given (the suite's llamacpp-gpu reads it; with the moe128
        # ones exported, build raced gguf128-bg for /tmp/x-moe128.gguf)
        SHAPE=moe32 GGUF=/tmp/x.gguf ROWS=none DEADLINE=${BUILD_DEADLINE:-400} \
            LLAMA_SRC=$LSRC OUT=$OUT/build bash bench/llamacpp-hook.sh >"$OUT/build.log" 2>&1
        rc=$?
        tail -4 "$OUT/build/summary.txt" ;;
    build-bg)
        if ! pgrep -f "llamacpp-device.sh build\$" >/dev/null; then
            # BG_CPUS: its cores (e.g. 8-15, beside bigload's 0-7)
            (setsid nohup nice -n 15 taskset -c "${BG_CPUS:-0-$(($(nproc) - 1))}" \
                env OUT=/tmp/bgb bash bench/llamacpp-device.sh build \
                >/tmp/bgb.log 2>&1 </dev/null &)
        fi
        rc=0 ;;
    build-wait)
        while pgrep -f "llamacpp-device.sh build\$" >/dev/null && [ "$(el)" -lt 560 ]; do sleep 2; done
        tail -3 /tmp/bgb.log
        grep -q "build: exit 0" /tmp/bgb.log
        rc=$? ;;
    shim)
        [ -f build-gpu/build.ninja ] ||
            meson setup build-gpu -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}" >"$OUT/setup.log" 2>&1
        meson configure build-gpu -Dtests=enabled >/dev/null 2>&1
        ninja -C build-gpu >"$OUT/shim.log" 2>&1
        rc=$?
        tail -2 "$OUT/shim.log" ;;
    gguf128-bg)
        # the 128-expert GGUF made in a process session of its own, beside
        # the next steps (build: the two at once took 280 s on the H200);
        # gguf128 then waits for it
        if [ ! -s /tmp/x-moe128.gguf ] && ! pgrep -f "gguf-shape.py moe128" >/dev/null; then
            (GGUF_PY=$LSRC/gguf-py PEERS=$ROOT/.peers/llamacpp setsid nohup sh -c \
                'python3 bench/gguf-shape.py moe128 /tmp/x-moe128.gguf.part >/tmp/gguf128.log 2>&1 &&
                 mv /tmp/x-moe128.gguf.part /tmp/x-moe128.gguf' </dev/null >/dev/null 2>&1 &)
        fi
        rc=0 ;;
    gguf128)
        while pgrep -f "gguf-shape.py moe128" >/dev/null && [ "$(el)" -lt 560 ]; do sleep 2; done
        if [ -s /tmp/x-moe128.gguf ]; then
            rc=0
        else
            GGUF_PY=$LSRC/gguf-py PEERS=.peers/llamacpp python3 bench/gguf-shape.py \
                moe128 /tmp/x-moe128.gguf.part >"$OUT/gguf128.log" 2>&1 &&
                mv /tmp/x-moe128.gguf.part /tmp/x-moe128.gguf
            rc=$?
        fi
        [ -f /tmp/gguf128.log ] && tail -3 /tmp/gguf128.log
        ls -la /tmp/x-moe128.gguf ;;
    probe)
        { nvcc -O2 -arch=sm_90 -I bench -o /tmp/picked-copy bench/picked-copy.cu -lcuda &&
            timeout 180 /tmp/picked-copy ${PROBE_ARGS:-8 128 3 8,40,100}; } >"$OUT/probe.log" 2>&1
        rc=$?
        tail -24 "$OUT/probe.log" ;;
    calibrate)
        # the device model of this GPU for woffload-replay (docs/replay.md):
        # $OUT/calibrate.model, to become tools/models/h200.model
        ninja -C build-gpu >"$OUT/calibrate-build.log" 2>&1 &&
            timeout 300 build-gpu/tools/woffload-calibrate -o "$OUT/calibrate.model" \
                --reps "${CALIBRATE_REPS:-7}" >"$OUT/calibrate.log" 2>&1
        rc=$?
        tail -4 "$OUT/calibrate.log" ;;
    vmmprobe)
        { nvcc -O2 -arch=sm_90 -I bench -o /tmp/vmm-host-copy bench/vmm-host-copy.cu -lcuda &&
            timeout 120 /tmp/vmm-host-copy "${VMM_ROUNDS:-10}"; } >"$OUT/vmm-host-copy.txt" 2>&1
        rc=$?
        tail -8 "$OUT/vmm-host-copy.txt" ;;
    uvmrelease)
        { nvcc -O2 -arch=sm_90 -I bench -o /tmp/uvm-release bench/uvm-release.cu &&
            timeout 120 /tmp/uvm-release "${UVM_RELEASE_GIB:-4}"; } >"$OUT/uvm-release.txt" 2>&1
        rc=$?
        tail -12 "$OUT/uvm-release.txt" ;;
    pack)
        if [ -x /tmp/llb/bin/llama-batched-bench ] && [ -s /tmp/llb/cpu-key ]; then
            tar cf - -C /tmp/llb bin cpu-key | xz -T0 -6 >"$OUT/llb-bin.txz"
            rc=$?
            if [ "$(stat -c %s "$OUT/llb-bin.txz")" -gt $((15 << 20)) ]; then
                split -b 15M "$OUT/llb-bin.txz" "$OUT/llb-bin.txz.part-" && rm "$OUT/llb-bin.txz"
            fi
            ls -la "$OUT"/llb-bin.txz*
        else
            echo "pack: no llama.cpp build with its cpu-key in /tmp/llb (run build first)"
            rc=1
        fi ;;
    suite1)
        meson configure build-gpu -Dtests=enabled >/dev/null 2>&1
        ninja -C build-gpu >/dev/null 2>&1
        # shellcheck disable=SC2046
        bench/gpu-suite.sh "$OUT/gpu-suite-1.txt" $(suite_part1)
        rc=$?
        tail -12 "$OUT/gpu-suite-1.txt" ;;
    suite2 | suite2a | suite2b)
        # suite2a: llamacpp-gpu alone, suite2b: stream-gpu alone (together
        # they took 545 s on the H200, before llamacpp-gpu's engine row)
        part=("${SUITE_B[@]}")
        [ "$step" = suite2a ] && part=("${SUITE_B[0]}")
        [ "$step" = suite2b ] && part=("${SUITE_B[1]}")
        meson configure build-gpu -Dtests=enabled >/dev/null 2>&1
        LLAMA_TOKENS=/tmp/llb/llamacpp-tokens LLAMA_GGUF=/tmp/x.gguf \
            LLAMA_BENCH=/tmp/llb/bin/llama-batched-bench \
            bench/gpu-suite.sh "$OUT/gpu-suite-${step#suite}.txt" "${part[@]}"
        rc=$?
        tail -12 "$OUT/gpu-suite-${step#suite}.txt" ;;
    gputests)
        # some of the gpu suite's tests (GPU_TESTS, space-separated, e.g.
        # "bigload-gpu"; BIGLOAD_GPU_ROWS=fit-bind picks that test's rows),
        # recorded as $OUT/gpu-tests.txt
        : "${GPU_TESTS:?GPU_TESTS: the gpu suite tests to run}"
        meson configure build-gpu -Dtests=enabled >/dev/null 2>&1
        ninja -C build-gpu >/dev/null 2>&1
        # shellcheck disable=SC2086
        LLAMA_TOKENS=/tmp/llb/llamacpp-tokens LLAMA_GGUF=/tmp/x.gguf \
            LLAMA_BENCH=/tmp/llb/bin/llama-batched-bench \
            bench/gpu-suite.sh "$OUT/gpu-tests.txt" $GPU_TESTS
        rc=$?
        grep -E '^(ok|FAIL)' "$OUT/gpu-tests.txt" | tail -30 ;;
    streamrows)
        : "${STREAM_ROWS:?STREAM_ROWS: the stream-gpu rows to run}"
        for i in $(seq "${STREAM_REPEAT:-3}"); do
            {
                echo "=== run $i of ${STREAM_REPEAT:-3}: $STREAM_ROWS ($(el) s into the call)"
                # shellcheck disable=SC2086
                WO_STREAM_JOBS=1 WO_STREAM_ROW_S=${STREAM_ROW_S:-150} \
                    timeout -k 10 $((${STREAM_ROW_S:-150} * 2 + 60)) \
                    python3 tests/gpu/test-stream-gpu.py build-gpu/tools/woffload-run $STREAM_ROWS 2>&1
                echo "=== run $i: exit $?"
            } >>"$OUT/stream-rows.txt"
        done
        if grep -q '^FAIL' "$OUT/stream-rows.txt"; then rc=1; else rc=0; fi
        grep -E '^(=== run|FAIL)' "$OUT/stream-rows.txt" | tail -30 ;;
    hook)
        : "${HOOK_ROWS:?HOOK_ROWS: the llamacpp-hook.sh rows to run}"
        mkdir -p "$OUT/hook"
        host_read
        ROWS=$HOOK_ROWS DEADLINE=$left LLAMA_SRC=$LSRC OUT=$OUT/hook \
            bash bench/llamacpp-hook.sh >"$OUT/hook.log" 2>&1
        rc=$?
        tail -20 "$OUT/hook/summary.txt" ;;
    soak-start)
        rm -rf /tmp/soak && mkdir -p /tmp/soak
        soak_min=${SOAK_MINUTES:-10}
        (
            export SOAK_MINUTES=$soak_min SOAK_RATE=${SOAK_RATE:-0.25} ROWS=${SOAK_ROW:-shim-exps}
            export LLAMA_BIN=/tmp/llb/bin GGUF=${GGUF:-/tmp/x.gguf} OUTROOT=/tmp/soak
            export SHIM_BUILD=$ROOT/build-gpu ROW_S=$((soak_min * 60 + 240)) END_S=$((soak_min * 60 + 400))
            setsid nohup bash -c 'bash bench/llamacpp-serve-rows.sh; touch /tmp/soak/done' \
                >/tmp/soak/rows.log 2>&1 </dev/null &
        )
        sleep 2
        pgrep -f llamacpp-serve-rows.sh >/dev/null
        rc=$?
        echo "soak: ${SOAK_ROW:-shim-exps}, $soak_min min at ${SOAK_RATE:-0.25} req/s, --parallel ${PARALLEL:-32}: started (rc $rc)" ;;
    soak-wait)
        while [ ! -e /tmp/soak/done ] && [ "$(el)" -lt 560 ]; do sleep 5; done
        [ -e /tmp/soak/done ]
        rc=$?
        [ "$rc" -eq 0 ] || echo "soak: not done yet: call soak-wait again"
        mkdir -p "$OUT/soak" && cp -r /tmp/soak/. "$OUT/soak/"
        tail -5 /tmp/soak/rows.log ;;
    e2e)
        : "${E2E_SCENARIOS:?E2E_SCENARIOS: the bench/e2e.py scenarios to run}"
        [ -f build-gpu/build.ninja ] ||
            meson setup build-gpu -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}" >"$OUT/setup.log" 2>&1
        ninja -C build-gpu >"$OUT/e2e-build.log" 2>&1
        mkdir -p "$OUT/e2e"
        python3 bench/e2e.py --build build-gpu --out "$OUT/e2e" --keep-going \
            --deadline $((left - 20)) --commit "$WO_COMMIT" --scenarios "$E2E_SCENARIOS" \
            >"$OUT/e2e.log" 2>&1
        rc=$?
        # the traces its trace-* scenarios recorded (WOFFLOAD_TRACE=/tmp/wo-trace-*),
        # compressed, for tests/traces and the replay's checks
        # and each one replayed with this GPU's device model (the replay's
        # predicted / recorded step, docs/replay.md): its `picked:` line and
        # the ratio, in e2e/replay.txt
        for t in /tmp/wo-trace-*.wotrace; do
            [ -f "$t" ] || continue
            gzip -c "$t" >"$OUT/e2e/$(basename "$t" .wotrace).wot.gz"
            {
                echo "== $(basename "$t") (tools/models/h200.model)"
                build-gpu/tools/woffload-replay "$t" --device tools/models/h200.model 2>&1 |
                    grep -E 'predicted / recorded|picked:|decode step' | head -8
            } >>"$OUT/e2e/replay.txt"
        done
        [ -f "$OUT/e2e/replay.txt" ] && cat "$OUT/e2e/replay.txt"
        tail -30 "$OUT/e2e.log" ;;
    bigload)
        [ -f build-gpu/build.ninja ] ||
            meson setup build-gpu -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}" >"$OUT/setup.log" 2>&1
        ninja -C build-gpu >"$OUT/bigload-build.log" 2>&1
        host_read
        mkdir -p "$OUT/bigload" /tmp/bigload-calls
        # BIGLOAD_WITH_PREV=1: the rows of this machine's earlier bigload
        # calls join the report (bigload.py --with; plain is not run again)
        prev=""
        [ "${BIGLOAD_WITH_PREV:-0}" = 1 ] &&
            prev=$(find /tmp/bigload-calls -name '*.json' 2>/dev/null | sort | paste -sd, -)
        # every row on cores 0-7 unless BIGLOAD_CPUS says (b1 is the CPU's
        # launches: one set of cores for every row and every call)
        export BIGLOAD_CPUS="${BIGLOAD_CPUS-0-7}"
        # STALL_STACKS=1: the shim's log of every row in $OUT/bigload/shim.log,
        # and at the first "looks stuck" in it every thread's stack of that
        # row (bench/stall-stacks.sh), which is then killed: the next row runs
        if [ "${STALL_STACKS:-0}" = 1 ]; then
            export WOFFLOAD_LOG_FILE=$OUT/bigload/shim.log
            STALL_KILL=1 bash bench/stall-stacks.sh "$WOFFLOAD_LOG_FILE" "$OUT/bigload" \
                'looks stuck' "$left" >"$OUT/bigload/stall-watch.log" 2>&1 &
            watcher=$!
        fi
        # shellcheck disable=SC2086
        python3 bench/bigload.py --build build-gpu --out "$OUT/bigload" --deadline $((left - 15)) \
            ${prev:+--with "$prev"} ${BIGLOAD_ARGS:-} >"$OUT/bigload.log" 2>&1
        rc=$?
        [ -n "${watcher:-}" ] && kill "$watcher" 2>/dev/null
        unset WOFFLOAD_LOG_FILE watcher
        [ -f "$OUT/bigload/bigload.json" ] &&
            cp "$OUT/bigload/bigload.json" "/tmp/bigload-calls/$(date +%s).json"
        tail -40 "$OUT/bigload/bigload.md" 2>/dev/null || tail -20 "$OUT/bigload.log" ;;
    rows)
        # The rows' folder outlives the call on the warm machine (/tmp/rows), so
        # that a later call's rows check their greedy ids against an earlier
        # call's llama.cpp or plain row and one table covers them all
        : "${ROWS:?ROWS: the rows of bench/llamacpp-serve-rows.sh to run}"
        host_read
        rr=/tmp/rows
        [ "${ROWS_FRESH:-0}" = 1 ] && rm -rf "$rr"
        mkdir -p "$rr"
        LLAMA_BIN=/tmp/llb/bin GGUF=${GGUF:-/tmp/x.gguf} OUTROOT=$rr SHIM_BUILD=$ROOT/build-gpu \
            ROW_DONE=$OUT END_S=${END_S:-$left} bash bench/llamacpp-serve-rows.sh
        rc=$?
        # this call's rows came back as each ended (ROW_DONE; a row run again
        # under its name comes back too); the policies and tables now
        cp "$rr"/*.yaml "$rr"/rows.md "$OUT"/ 2>/dev/null
        python3 bench/llamacpp-serve-table.py "$rr" >"$OUT/rows-all.md" 2>&1 ;;
    *)
        echo "llamacpp-device: unknown step $step (shim, build, build-bg, build-wait, gguf128, probe, calibrate, vmmprobe, uvmrelease, pack, suite1, suite2, gputests, rows, soak-start, soak-wait, hook, e2e, bigload)"
        rc=2 ;;
    esac
    echo "[device $(el)s] $step: exit $rc"
    [ "$rc" -eq 0 ] || rc_all=1
done
if [ -n "${TAR:-}" ]; then
    for d in "$OUT"/*/; do
        [ -d "$d" ] || continue
        tar czf "${d%/}.tgz" -C "$OUT" "$(basename "$d")" && rm -rf "$d"
    done
fi
exit $rc_all
