#!/usr/bin/env bash
# bench/llamacpp-serve-rows.sh: issue 40's rows side by side, one
# bench/llamacpp-serve.sh run a row, on the same llama-server binary and GGUF:
#
#   LLAMA_BIN=/tmp/llb/bin GGUF=/tmp/x.gguf OUTROOT=$OUT PARALLEL=32 \
#     ROWS="plain shim-exps llama-ot shim-ncmoe8 llama-ncmoe8" bash bench/llamacpp-serve-rows.sh
#
# Rows (each in OUTROOT/pP-ROW; the default row comes first, the others
# check their greedy ids against its greedy.json when it is there):
#   plain          llama-server, all on the GPU
#   shim-empty     woffload-run --policy examples/empty.yaml
#   shim-exps      woffload-run --policy examples/llamacpp-ot-exps-cpu.yaml
#   shim-exps-stream  woffload-run --policy examples/llamacpp-exps-stream.yaml
#                  (the same, every step's host experts staged into slots)
#   shim-ROW-slotsN  any shim row with prefetch: {slots: N}, N 1-8 (the policy
#                  written to OUTROOT; shim-fit-slotsN: --fit with a policy of
#                  that key alone): the staging slots' device memory at N of
#                  the expert tensors, for rows at equal memory with llama-ot (on
#                  the moe32 GGUF at --parallel 32, shim-exps-slots3: bench/results/
#                  llamacpp-serve-20261204c-p32-c32-ot-h200); under fit the slots'
#                  room goes to weights
#   shim-exps-hotN  shim-exps with prefetch: {hot_experts: NGiB}, N 1-99 (the
#                  policy written to OUTROOT): every expert host, N GiB of device
#                  memory kept for the experts the picked copies move most (the
#                  ggml hook then registers every compute's picks; docs/picks.md,
#                  Hot experts): residency by use at expert grain, for rows at
#                  equal memory with llama-ncmoe8 (half the layers' experts resident)
#   shim-*-dma     the row with its picked copies on the copy engine
#                  (WOFFLOAD_PICKS_ENGINE=$DMA_FROM [50]; with hot experts the
#                  kernels copy the hot rows, the copy engine the others)
#   llama-ot       llama-server -ot exps=CPU -lm none (host experts pinned)
#   shim-managed   woffload-run --policy examples/llamacpp-exps-managed.yaml,
#                  WO_EXPERT_BUDGET=$EXPERT_BUDGET [9GiB: half the moe32 experts]
#   shim-ncmoe8    woffload-run --policy examples/llamacpp-n-cpu-moe.yaml
#   shim-ncmoeN    the same rule for layers 0 to N-1, N 1-99 (the policy written
#                  to OUTROOT): a layer more than llama-ncmoe8 gives back
#                  the room of the shim's staging (one moe32 layer's experts:
#                  1,152 MiB), for rows at equal memory
#   shim-ncmoe-odd the experts of the odd layers host (8 of the moe32 GGUF's 16,
#                  as llama-ncmoe8's memory; the policy written to OUTROOT): the
#                  same bytes off the device as shim-ncmoe8, spread through the
#                  step, so that each host layer's copies run beside a resident
#                  layer's compute rather than after eight of them
#   shim-spreadN   the experts of N of the LAYERS [16] layers host, spread evenly
#                  (layer floor((k + 1/2) LAYERS / N) for k < N; N 1-99; the policy
#                  written to OUTROOT): shim-spread8 is shim-ncmoe-odd, shim-spread9
#                  gives back the room of its staging as shim-ncmoe9 does
#   llama-ncmoe8   llama-server --n-cpu-moe 8 -lm none
#   shim-fit       woffload-run --fit $FIT (FIT: the device memory a llama.cpp
#                  row was measured to use, for a row at equal memory; FIT=from:ROW
#                  takes it from row ROW run before it in OUTROOT: the most device
#                  memory its server held in any phase, in MiB: the devices'
#                  used memory less their idle, bench/llamacpp-serve-table.py)
#                  With FIT=from:llama-ot or from:shim-exps*, the row takes the
#                  experts-host rows' rates and phases (R_SLOW, DURATION_SLOW),
#                  else the half-resident rows' (R_MID)
#   shim-ROW-late  any shim row with WOFFLOAD_LATE_BIND=1: llama.cpp's model
#                  buffer late bound, its host tensors pinned host memory that
#                  the streaming executor copies from on the copy engine
#                  (docs/placement.md, Late binding)
#   shim-ROW-tail  any shim row with WOFFLOAD_DEPARTURE_FENCES=0: staging
#                  copies wait for the kernels the engine submitted last
#                  (docs/prefetch.md, Departure fences), to measure the change
#   shim-ROW-lag2  any shim row with WOFFLOAD_DEPARTURE_LAG=2: a slot's departure
#                  fence one range after the engine left its range, so the
#                  executor stages slots - 2 ranges ahead (the default before
#                  the ggml hook said woffload_departure_lag(1): docs/prefetch.md,
#                  Departure fences); shim-ROW-lag1 gives the hook's lag of one
#                  explicitly (rows of earlier results)
#   shim-ROW-nopicks  any shim row with WOFFLOAD_GGML_PICKS_FROM=0: no picked
#                  copies for the computes whose share of experts picked is
#                  80-92% (docs/llamacpp.md, Picked experts), and none of their
#                  buffers (768 MiB on the moe32 GGUF, beside 4 slots' 1536): what
#                  that band is worth in serving, at what memory
#   shim-ROW-band  any shim row with WOFFLOAD_GGML_PICKS_FROM=80: the hook's
#                  band of picked copies given (under fit it is off unless
#                  given: docs/llamacpp.md, Picked experts), to measure it
#   shim-ROW-nolend  any shim row with WOFFLOAD_FIT_LEND=0: fit's room for the
#                  slots kept empty, not lent to managed weights (which the
#                  kernels read in place beside the copies while the slots are busy)
#   shim-ROW-inorder  any shim row with WOFFLOAD_FIT_SPREAD=0: fit keeps
#                  equal-value tensors on the device in the engine's order (the
#                  first layers'), not spread through the step, to measure the change
#   shim-ROW-bytensor  any shim row with WOFFLOAD_FIT_LAYERS=0: fit's spread
#                  takes equal-value tensors one by one, so that a layer keeps one
#                  or two of its three expert tensors, not whole layers off the
#                  device (the default, as shim-spreadN's hand split sends them)
#   shim-ROW-bylayer  any shim row with WOFFLOAD_FIT_LAYERS=1 (the default since
#                  2026-12-07; the rows of stop 97 named it)
#   shim-fit-reserveN  fit (with any other suffix) with --reserve NMiB: the room
#                  fit keeps for what the engine allocates after seal (256 MiB
#                  by default; llama-server allocated 64 MiB after seal), so that
#                  the rest holds weights
#   shim-ROW-full  any shim row beside a blocker process (bench/gpu-blocker.py)
#                  that leaves free only the row's fit size plus FULL_SLACK_MIB
#                  [256] (FULL_LEAVE_MIB, given, instead): the device as full as
#                  a model larger than it makes it, so that the engine's and the
#                  shim's allocations take back what UVM keeps cached of evicted
#                  managed pages instead of free memory (the lent weights of
#                  docs/placement.md, "fit"); the row's device memory leaves the
#                  blocker's out (gpu-idle-mib is read after it holds); a fit
#                  row's keep_free is that slack (--keep-free)
#   shim-ROW-split the ggml hook splits the model buffer by tensor under any
#                  policy (WOFFLOAD_GGML_SPLIT=2; fit rows do by default);
#                  shim-ROW-one: never (0), one buffer
#   ROW.N          ROW run again (its folder pP-ROW.N): "plain shim-empty plain.2
#                  shim-empty.2" interleaves two runs of each, so that the
#                  machine's drift between runs shows beside the rows' difference
# At the end OUTROOT/rows.md puts the rows side by side, a table a phase, each
# against plain (bench/llamacpp-serve-table.py: medians and ranges of repeats).
# Settings (environment; defaults in brackets): PARALLEL [32]; CTX
# [PARALLEL x 1024]; PROMPT_LEN [uniform:16:48] and OUTPUT_LEN [fixed:32]
# (bench/gguf-shape.py's GGUFs take 7.4 tokens a word); DURATION [40] and
# DRAIN [10] a phase, ROW_S [200]; the experts-host rows (R_SLOW) take
# DURATION_SLOW [120], DRAIN_SLOW [60] and ROW_S_SLOW [their phases x
# (DURATION_SLOW + DRAIN_SLOW) + 100: 280 s for the one default phase] instead: at
# --parallel 32 a step of -ot exps=CPU took 719 ms, a request of 32 tokens
# 30 s, and a 30 s closed loop completed one wave, no request sent after the
# bad one (bench/results/llamacpp-serve-20261204b-p32-c32-h200); the phases of a row (serve.py --rates: Poisson rates
# in req/s, and cN, a closed loop of N requests in flight) R_FAST (plain,
# shim-empty) [8,16,cP], R_SLOW (experts host) [cP: its phases are long], R_MID (half
# resident) [1.5,3,cP], where P is PARALLEL: the closed loop at P requests
# is the server's throughput with every slot busy and no queue, the figure
# that compares rows at saturation (an open loop past it builds a backlog
# whose mix of prompts and decodes swings from run to run: plain against
# plain differed by 0.83x at 32 req/s on the H200,
# bench/results/llamacpp-serve-20261204-p32-empty-h200); FAULTS [0] (1: each
# row's fault checks, a later row's judged against the plain row's when it ran
# them: FAULTS_AGAINST, serve-faults.py --against); ROW_S, the most seconds a row may take; END_S, the seconds for all
# rows [570] (a row with less than 90 s left is skipped); DRY_RUN [0]: 1
# writes each row's policy and prints what it would run (its server command
# and the shim's settings it sets), running nothing; BAN_BYTE_TOKENS [1]:
# every request bans token ids 3-258 (logit_bias), the byte tokens of
# bench/gguf-shape.py's placeholder vocabulary: a completion cut inside a
# UTF-8 character fails llama-server's content parser, which streams a 500
# ("does not match the expected Content-only format") in 2-8% of requests, in
# every row (bench/results/llamacpp-serve-faults-20261129-1636-h200); 0 for a real
# model's GGUF; EXTRA_BODY, JSON merged into every request (replaces the ban);
# ROW_DONE, a folder each row is copied into as it ends;
# SERVER_ARGS, llama-server arguments of every row [--cache-ram 0: no prompt
# cache in host memory; random prompts never hit it, and filling it grows the
# server's RSS by up to 8 GiB, llama-server's default cap, which a soak would
# read as growth; every eviction from it is also logged]; SHIM_BUILD,
# the shim's build directory [build]. The shim's rows write their stats
# every second (--stats-every 1), so the sweep has the shim's figures of each
# phase and a server killed at its stop still leaves them. Between rows every llama-server left
# is stopped by its exact name (never `pkill -f`, which matches this script).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
: "${LLAMA_BIN:?LLAMA_BIN: the directory holding llama-server}"
GGUF=${GGUF:?GGUF: the model}
OUTROOT=${OUTROOT:?OUTROOT: where the rows go}
ROWS=${ROWS:-plain shim-exps llama-ot}
P=${PARALLEL:-32}
RUN=${SHIM_BUILD:-$ROOT/build}/tools/woffload-run
END=${END_S:-570}
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
export LLAMA_BIN
if [ -z "${EXTRA_BODY:-}" ] && [ "${BAN_BYTE_TOKENS:-1}" = 1 ]; then
    EXTRA_BODY=$(python3 -c 'import json; print(json.dumps({"logit_bias": [[t, False] for t in range(3, 259)]}))')
fi
export EXTRA_BODY
# ROW_DONE: a folder each row's folder is copied into as the row ends (the
# device call's $OUT), so that a call cut at its limit still brings back the
# rows it finished
row_done() { [ -n "${ROW_DONE:-}" ] && cp -rT "$O" "$ROW_DONE/$(basename "$O")" 2>/dev/null; }
for row in $ROWS; do
    left=$((END - $(el)))
    if [ "$left" -lt 90 ]; then echo "[serve-rows $(el)s] $row: SKIPPED, $left s left"; continue; fi
    O=$OUTROOT/p$P-$row
    unset SHIM_CMD STATS GREEDY_REF FAULTS_AGAINST WO_EXPERT_BUDGET WOFFLOAD_LATE_BIND WOFFLOAD_DEPARTURE_FENCES WOFFLOAD_DEPARTURE_LAG \
        WOFFLOAD_GGML_PICKS_FROM WOFFLOAD_PICKS_ENGINE WOFFLOAD_FIT_SPREAD WOFFLOAD_FIT_LEND WOFFLOAD_FIT_LAYERS \
        WOFFLOAD_GGML_SPLIT
    POL="" SLOTS="" RESERVE="" FULL="" FITSZ="" LEAVE="" BPID="" slow=0
    export LLAMA_ARGS=${SERVER_ARGS---cache-ram 0}
    name=$row
    case $row in *.[0-9]*) name=${row%.*} ;; esac  # ROW.N: ROW again
    base=$name
    while :; do  # the suffixes, in any order
        case $base in
        shim-*-late) base=${base%-late}; export WOFFLOAD_LATE_BIND=1 ;;
        shim-*-tail) base=${base%-tail}; export WOFFLOAD_DEPARTURE_FENCES=0 ;;
        shim-*-lag1) base=${base%-lag1}; export WOFFLOAD_DEPARTURE_LAG=1 ;;
        shim-*-lag2) base=${base%-lag2}; export WOFFLOAD_DEPARTURE_LAG=2 ;;
        shim-*-nopicks) base=${base%-nopicks}; export WOFFLOAD_GGML_PICKS_FROM=0 ;;
        shim-*-band) base=${base%-band}; export WOFFLOAD_GGML_PICKS_FROM=80 ;;
        shim-*-dma) base=${base%-dma}; export WOFFLOAD_PICKS_ENGINE=${DMA_FROM:-50} ;;
        shim-*-nolend) base=${base%-nolend}; export WOFFLOAD_FIT_LEND=0 ;;
        shim-*-full) base=${base%-full}; FULL=1 ;;
        shim-*-split) base=${base%-split}; export WOFFLOAD_GGML_SPLIT=2 ;;
        shim-*-one) base=${base%-one}; export WOFFLOAD_GGML_SPLIT=0 ;;
        shim-*-inorder) base=${base%-inorder}; export WOFFLOAD_FIT_SPREAD=0 ;;
        shim-*-bylayer) base=${base%-bylayer}; export WOFFLOAD_FIT_LAYERS=1 ;;
        shim-*-bytensor) base=${base%-bytensor}; export WOFFLOAD_FIT_LAYERS=0 ;;
        shim-*-slots[1-8]) SLOTS=${base##*-slots}; base=${base%-slots*} ;;
        shim-fit*-reserve[0-9]*) RESERVE=${base##*-reserve}; base=${base%-reserve*}
            case $RESERVE in *[!0-9]*) echo "[serve-rows] $row: -reserveN takes MiB, a number"; base=bad ;; esac ;;
        *) break ;;
        esac
    done
    case $base in
    plain) R=${R_FAST:-8,16,c$P} ;;
    shim-empty) R=${R_FAST:-8,16,c$P}; POL=examples/empty.yaml ;;
    shim-exps) R=${R_SLOW:-c$P}; POL=examples/llamacpp-ot-exps-cpu.yaml ;;
    shim-exps-stream) R=${R_SLOW:-c$P}; POL=examples/llamacpp-exps-stream.yaml ;;
    shim-exps-hot[1-9] | shim-exps-hot[1-9][0-9]) R=${R_SLOW:-c$P}; n=${base#shim-exps-hot}
        POL=$OUTROOT/llamacpp-exps-hot$n.yaml
        sed "s/^default: device\$/default: device\\nprefetch:\\n  hot_experts: ${n}GiB/" \
            "$ROOT/examples/llamacpp-ot-exps-cpu.yaml" >"$POL" ;;
    llama-ot) R=${R_SLOW:-c$P}; LLAMA_ARGS="$LLAMA_ARGS -ot exps=CPU -lm none" ;;
    shim-managed) R=${R_MID:-1.5,3,c$P}; POL=examples/llamacpp-exps-managed.yaml
        export WO_EXPERT_BUDGET=${EXPERT_BUDGET:-9GiB} ;;
    shim-ncmoe8) R=${R_MID:-1.5,3,c$P}; POL=examples/llamacpp-n-cpu-moe.yaml ;;
    shim-ncmoe[1-9] | shim-ncmoe[1-9][0-9]) R=${R_MID:-1.5,3,c$P}; n=${base#shim-ncmoe}
        POL=$OUTROOT/llamacpp-n-cpu-moe$n.yaml
        alt=$(seq -s '|' 0 $((n - 1)))
        sed -e "s/^  - name: experts-of-layers-0-7\$/  - name: experts-of-layers-0-$((n - 1))/" \
            -e 's/\\\.\[0-7\]\\\./\\.('"$alt"')\\./' \
            "$ROOT/examples/llamacpp-n-cpu-moe.yaml" >"$POL" ;;
    shim-ncmoe-odd) R=${R_MID:-1.5,3,c$P}; POL=$OUTROOT/llamacpp-n-cpu-moe-odd.yaml
        { echo "# $base: the odd layers' experts host (bench/llamacpp-serve-rows.sh,"
          echo "# from examples/llamacpp-n-cpu-moe.yaml)"
          sed -e '/^#/d' -e 's/^  - name: experts-of-layers-0-7$/  - name: experts-of-the-odd-layers/' \
            -e 's/\\\.\[0-7\]\\\./\\.[0-9]*[13579]\\./' \
            "$ROOT/examples/llamacpp-n-cpu-moe.yaml"; } >"$POL" ;;
    shim-spread[1-9] | shim-spread[1-9][0-9]) R=${R_MID:-1.5,3,c$P}; n=${base#shim-spread}
        POL=$OUTROOT/llamacpp-spread$n.yaml
        alt=$(awk -v n="$n" -v l="${LAYERS:-16}" 'BEGIN { for (k = 0; k < n && k < l; k++)
            printf "%s%d", k ? "|" : "", int((k + 0.5) * l / n) }')
        { echo "# $base: the experts of $n of ${LAYERS:-16} layers host, spread through the step"
          echo "# (layers $alt; bench/llamacpp-serve-rows.sh, from examples/llamacpp-n-cpu-moe.yaml)"
          sed -e '/^#/d' -e "s/^  - name: experts-of-layers-0-7\$/  - name: experts-of-$n-layers-spread/" \
            -e 's/\\\.\[0-7\]\\\./\\.('"$alt"')\\./' \
            "$ROOT/examples/llamacpp-n-cpu-moe.yaml"; } >"$POL" ;;
    llama-ncmoe8) R=${R_MID:-1.5,3,c$P}; LLAMA_ARGS="$LLAMA_ARGS --n-cpu-moe 8 -lm none" ;;
    shim-fit) R=${R_MID:-1.5,3,c$P}; : "${FIT:?FIT: the size for the shim-fit row}"
        FITSZ=$FIT
        # at an experts-host row's memory, that row's rates and phases
        case $FIT in from:llama-ot* | from:shim-exps*) R=${R_SLOW:-c$P}; slow=1 ;; esac
        case $FIT in from:*)
            # equal memory: the device memory of that row's server process
            FITSZ=$("${PYTHON:-python3}" "$HERE/llamacpp-serve-table.py" --peak-mib \
                "$OUTROOT/p$P-${FIT#from:}") ||
                { echo "[serve-rows $(el)s] $row: FIT=$FIT: no size; skipped"; continue; }
            FITSZ=${FITSZ}MiB
            echo "[serve-rows $(el)s] $row: FIT=$FIT: --fit $FITSZ" ;;
        esac ;;
    *) echo "[serve-rows] $row: unknown row (see the header)"; continue ;;
    esac
    # -full: what the blocker leaves free (the fit size in MiB and the slack)
    if [ -n "$FULL" ]; then
        if [ -n "${FULL_LEAVE_MIB:-}" ]; then
            LEAVE=$FULL_LEAVE_MIB
        else
            case $FITSZ in [0-9]*MiB) LEAVE=$((${FITSZ%MiB} + ${FULL_SLACK_MIB:-256})) ;; esac
        fi
        case $LEAVE in
        "" | *[!0-9]*)
            echo "[serve-rows $(el)s] $row: -full needs a fit size in MiB or FULL_LEAVE_MIB (MiB, a number); skipped"
            continue ;;
        esac
        # fit keeps free only what the blocker left beyond its size (its
        # keep_free, 2 GiB by default, would take that much of the budget)
        KEEP=
        case $FITSZ in [0-9]*MiB)
            KEEP=$((LEAVE - ${FITSZ%MiB}))
            [ "$KEEP" -lt 0 ] && KEEP=0 ;;
        esac
    fi
    # a phase, its drain and the row's time: the experts-host rows' own
    # (their step is the link's or llama.cpp's CPU's: 719 ms for 32 slots)
    dur=${DURATION:-40} drain=${DRAIN:-10} per=${ROW_S:-200}
    case $base in shim-exps* | llama-ot) slow=1 ;; esac
    if [ "$slow" = 1 ]; then
        dur=${DURATION_SLOW:-120} drain=${DRAIN_SLOW:-60}
        # its phases, their drains, and 100 s for the load and the greedy
        # prompts sent alone (8 of about 6 s at this step)
        nph=$(($(printf %s "$R" | tr -cd , | wc -c) + 1))
        per=${ROW_S_SLOW:-$((nph * (dur + drain) + 100))}
    fi
    [ "$per" -gt "$left" ] && per=$left
    case $POL in /* | "") ;; *) POL=$ROOT/$POL ;; esac
    if [ -n "$SLOTS" ]; then
        # the row's policy (fit's: none) with prefetch: {slots: N} beside its
        # default; a policy with a prefetch key of its own is not rewritten
        if [ -n "$POL" ] && grep -q '^prefetch:' "$POL"; then
            echo "[serve-rows $(el)s] $row: $POL has a prefetch key already; skipped"; continue
        fi
        to=$OUTROOT/$(basename "${POL:-fit.yaml}" .yaml)-slots$SLOTS.yaml
        if [ -n "$POL" ]; then
            sed "s/^default: device\$/default: device\\nprefetch:\\n  slots: $SLOTS/" "$POL" >"$to"
        else
            printf 'version: 1\ndefault: device\nprefetch:\n  slots: %s\n' "$SLOTS" >"$to"
        fi
        grep -q "^  slots: $SLOTS\$" "$to" || { echo "[serve-rows $(el)s] $row: no default: device in $POL; skipped"; continue; }
        POL=$to
    fi
    case $base in
    shim-fit) export STATS=$O/stats.json SHIM_CMD="$RUN --fit $FITSZ${FULL:+${KEEP:+ --keep-free ${KEEP}MiB}}${RESERVE:+ --reserve ${RESERVE}MiB}${POL:+ --policy $POL} --stats $O/stats.json --stats-every 1 --" ;;
    shim-*)
        export STATS=$O/stats.json SHIM_CMD="$RUN --policy $POL --stats $O/stats.json --stats-every 1 --" ;;
    esac
    # the greedy ids to match: plain's, else llama-ot's when it ran first
    # (a repeat of plain checks against the first plain run), else, for any
    # row but plain, those of another of llama.cpp's own rows run before
    # (llama-ncmoe8: a repeat against the first run)
    # the fault checks of a row judged against the plain row's, when it ran
    # them (serve-faults.py --against: llama-server's own failures are not the shim's)
    if [ "$row" != plain ] && [ -s "$OUTROOT/p$P-plain/faults.json" ]; then
        export FAULTS_AGAINST=$OUTROOT/p$P-plain/faults.json
    fi
    if [ "$row" != plain ] && [ -s "$OUTROOT/p$P-plain/greedy.json" ]; then
        export GREEDY_REF=$OUTROOT/p$P-plain/greedy.json
    elif [ "$name" != llama-ot ] && [ -s "$OUTROOT/p$P-llama-ot/greedy.json" ]; then
        export GREEDY_REF=$OUTROOT/p$P-llama-ot/greedy.json
    elif [ "$name" != plain ]; then
        for g in "$OUTROOT"/p"$P"-llama-*/greedy.json; do
            if [ "$g" != "$OUTROOT/p$P-$row/greedy.json" ] && [ -s "$g" ]; then
                export GREEDY_REF=$g
                break
            fi
        done
    fi
    if [ "${DRY_RUN:-0}" = 1 ]; then
        [ -n "${GREEDY_REF:-}" ] && echo "[serve-rows] $row: greedy ids against $GREEDY_REF"
        echo "[serve-rows] $row: rates $R, $dur s a phase (+ drain <= $drain s)"
        [ -n "$LEAVE" ] && echo "[serve-rows] $row: a blocker leaves $LEAVE MiB free (bench/gpu-blocker.py)"
        echo "[serve-rows] $row: would run: ${SHIM_CMD:+$SHIM_CMD }llama-server $LLAMA_ARGS;" \
            "$(env | grep -E '^WOFFLOAD_(LATE_BIND|DEPARTURE_FENCES|DEPARTURE_LAG|GGML_PICKS_FROM|PICKS_ENGINE|FIT_SPREAD|FIT_LEND|FIT_LAYERS|GGML_SPLIT)=' |
                sort | paste -sd ' ' -)"
        continue
    fi
    mkdir -p "$O"
    if [ -n "$LEAVE" ]; then
        "${PYTHON:-python3}" "$HERE/gpu-blocker.py" --leave "${LEAVE}MiB" >"$O/blocker.log" 2>&1 &
        BPID=$!
        for _ in $(seq 120); do
            grep -q '^gpu-blocker: held' "$O/blocker.log" && break
            kill -0 "$BPID" 2>/dev/null || break
            sleep 0.5
        done
        if ! grep -q '^gpu-blocker: held' "$O/blocker.log"; then
            echo "[serve-rows $(el)s] $row: no blocker ($(tail -1 "$O/blocker.log")); skipped"
            kill "$BPID" 2>/dev/null
            row_done
            continue
        fi
        echo "[serve-rows $(el)s] $row: $(cat "$O/blocker.log")"
    fi
    echo "[serve-rows $(el)s] $row: --parallel $P, rates $R, $dur s a phase (+ drain <= $drain s), at most $per s"
    RATES=$R PARALLEL=$P CTX=${CTX:-$((P * 1024))} OUTPUT_LEN=${OUTPUT_LEN:-fixed:32} \
        PROMPT_LEN=${PROMPT_LEN:-uniform:16:48} DURATION=$dur DRAIN=$drain \
        FAULTS=${FAULTS:-0} LOAD_TIMEOUT=${LOAD_TIMEOUT:-150} DEADLINE=$per OUT=$O \
        bash "$HERE/llamacpp-serve.sh" "$GGUF" >"$O/run.log" 2>&1
    echo "[serve-rows $(el)s] $row: exit $?"
    grep -E '^=== phase|^throughput|ITL|^errors|^  example|^greedy|FAILED' "$O/llamacpp-serve.log" | tail -16
    pkill -x llama-server 2>/dev/null
    if [ -n "$BPID" ]; then
        kill -TERM "$BPID" 2>/dev/null
        wait "$BPID" 2>/dev/null
    fi
    row_done
    sleep 1
done
# the rows side by side (every pP-ROW in OUTROOT, this run's and earlier ones')
[ "${DRY_RUN:-0}" = 1 ] && exit 0
"${PYTHON:-python3}" "$HERE/llamacpp-serve-table.py" "$OUTROOT" --rows "$ROWS" >"$OUTROOT/rows.md" 2>&1 &&
    echo "[serve-rows $(el)s] side by side: $OUTROOT/rows.md"
