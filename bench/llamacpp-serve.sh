#!/usr/bin/env bash
# bench/llamacpp-serve.sh: issue 40 on the GPU machine, in one call of at
# most ~570 s once llama-server is built: start llama-server (under
# SHIM_CMD when given), wait for /health, a short Poisson rate sweep at
# one --parallel (bench/serve.py --server-kind llamacpp, RSS and device
# memory sampled every second), the fault checks (bench/serve-faults.py:
# disconnects, bad parameters, SIGTERM under load, restart with the same
# command gives the same token ids), then SIGTERM to whatever server is
# left, its exit time recorded. Every step runs even when an earlier one
# failed; each prints the elapsed seconds.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin OUT=/tmp/out \
#     bash bench/llamacpp-serve.sh MODEL.gguf
#   SHIM_CMD="build/tools/woffload-run --policy examples/P.yaml --stats /tmp/out/stats.json --" \
#     LLAMA_BIN=... OUT=... bash bench/llamacpp-serve.sh MODEL.gguf
#
# Settings (environment; defaults in brackets):
#   LLAMA_BIN     directory holding llama-server (required)
#   OUT           where the results go [$PWD/llamacpp-serve-STAMP]
#   SHIM_CMD  a prefix to the server's command line, e.g. woffload-run ... --
#   PARALLEL      llama-server --parallel [32]
#   CTX           llama-server -c, shared by the slots [PARALLEL x 1024]
#   NGL           llama-server -ngl [99]
#   LLAMA_ARGS    more llama-server arguments (e.g. "-ot exps=CPU", "--n-cpu-moe 8")
#   PORT          [8080]
#   RATES         the sweep's phases: request rates, req/s (Poisson), and cN, a closed
#                 loop of N requests in flight (serve.py --rates) [1,2,4,8,16]
#   DURATION      seconds of arrivals a rate [20]
#   DRAIN         seconds a phase waits for its last requests (past saturation) [15]
#   IDLE_WAIT     seconds the next phase and the greedy check wait for the server to
#                 be idle (serve.py --idle-wait: a backlog the drain closed is still
#                 served) [60]
#   PROMPT_LEN    [uniform:64:512]   OUTPUT_LEN [fixed:128]   SEED [0]
#                 (words: a small or synthetic vocabulary makes several tokens of a
#                 word, and a request over CTX / PARALLEL tokens gets llama-server's
#                 400 "exceeds the available context size"; bench/gguf-shape.py's
#                 GGUFs take 7.4 tokens a word (serve.py's usage_prompt_tokens_per_asked):
#                 uniform:16:64 with CTX = PARALLEL x 2048)
#   LOAD_TIMEOUT  seconds for /health after a start [180]
#   DEADLINE      seconds this script may take in all [560]
#   STATS         the shim's WOFFLOAD_STATS path, checked at the SIGTERM (optional)
#   EXTRA_BODY    JSON merged into every request's body, the fault checks' too (serve.py
#                 --extra-body), e.g. a logit_bias (bench/llamacpp-serve-rows.sh bans the
#                 synthetic vocabulary's byte tokens with it)
#   GREEDY_REF    a greedy file recorded by another run (e.g. plain): the sweep checks its token ids
#   FAULTS_AGAINST the plain server's faults.json: this run's fault checks judged against it
#                 (serve-faults.py --against: a failure plain shares, no worse here, is the server's own)
#   SOAK_MINUTES  instead of the sweep: one phase of this many minutes at SOAK_RATE req/s (issue 40:
#                 ~70% of the sweep's saturation), an interval line a minute; DEADLINE becomes
#                 SOAK_MINUTES x 60 + 300 unless set, and the fault checks run only with FAULTS=1.
#                 Longer than one 600 s device call: start it detached (setsid nohup ... &) and
#                 read OUT in later calls, if the machine keeps it between calls
#
# llama-server runs with --metrics: serve.py samples /metrics each second and
# reports, over each phase's steady window, the server's step period (its
# llama_decode calls) and the tokens it processed (prompt + generated): at
# saturation those compare rows, not the output rate a client sees, which
# swings with how prompts and decodes share the steps.
#
# Results in OUT: llamacpp-serve.md (the tables), sweep.json (serve.py's
# report, a phase a rate, memory samples in each), sweep-memory.png (the
# last phase; needs matplotlib), greedy.json (the greedy token ids: pass it
# as GREEDY_REF to another row), faults.json, stop.json, server-*.log,
# llamacpp-serve.log.
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
GGUF=${1:-${GGUF:-}}
: "${LLAMA_BIN:?LLAMA_BIN: the directory holding llama-server}"
[ -n "$GGUF" ] || { echo "usage: LLAMA_BIN=DIR [OUT=DIR] [SHIM_CMD=...] $0 MODEL.gguf" >&2; exit 2; }
OUT=${OUT:-$PWD/llamacpp-serve-$(date -u +%Y%m%d-%H%M%S)}
PARALLEL=${PARALLEL:-32}
CTX=${CTX:-$((PARALLEL * 1024))}
NGL=${NGL:-99}
PORT=${PORT:-8080}
RATES=${RATES:-1,2,4,8,16}
DURATION=${DURATION:-20}
DRAIN=${DRAIN:-15}
PROMPT_LEN=${PROMPT_LEN:-uniform:64:512}
OUTPUT_LEN=${OUTPUT_LEN:-fixed:128}
SEED=${SEED:-0}
LOAD_TIMEOUT=${LOAD_TIMEOUT:-180}
SOAK_MINUTES=${SOAK_MINUTES:-}
SOAK_RATE=${SOAK_RATE:-2}
if [ -n "$SOAK_MINUTES" ]; then
    DEADLINE=${DEADLINE:-$(awk -v m="$SOAK_MINUTES" 'BEGIN { printf "%d", m * 60 + 300 }')}
    FAULTS=${FAULTS:-0}
fi
DEADLINE=${DEADLINE:-560}
FAULTS=${FAULTS:-1}
PY=${PYTHON:-python3}
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"
T0=$(date +%s.%N)
STEPS_FAILED=()

elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
left() { awk -v a="$T0" -v b="$(date +%s.%N)" -v d="$DEADLINE" 'BEGIN { printf "%d", d - (b - a) }'; }
log() { printf '[%7ss] %s\n' "$(elapsed)" "$*" | tee -a "$OUT/llamacpp-serve.log"; }
step_rc() { # NAME RC
    if [ "$2" -ne 0 ]; then STEPS_FAILED+=("$1 (exit $2)"); log "$1: FAILED (exit $2)"; else log "$1: done"; fi
}

# the server's command line: SHIM_CMD's words, then llama-server's
# shellcheck disable=SC2206
SERVER=(${SHIM_CMD:-} "$LLAMA_BIN/llama-server" -m "$GGUF" --host 127.0.0.1 --port "$PORT"
        --parallel "$PARALLEL" -c "$CTX" -ngl "$NGL" --metrics ${LLAMA_ARGS:-})
SERVER_STR=$(printf '%q ' "${SERVER[@]}")
log "out $OUT; server: $SERVER_STR"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "commit: ${WO_COMMIT:-$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
    "$LLAMA_BIN/llama-server" --version 2>&1 | grep -i -m2 'version\|commit' | sed 's/^/llama-server: /'
    echo "server: $SERVER_STR"
    env | grep '^WOFFLOAD_' | sort | sed 's/^/environment: /'
    # a long logit_bias list (the rows script's ban of byte tokens) is shown as its ranges
    [ -n "${EXTRA_BODY:-}" ] && echo "request body extra: $("$PY" -c 'import json, sys
b = json.loads(sys.argv[1]); lb = b.get("logit_bias")
if isinstance(lb, list) and len(lb) > 8 and all(isinstance(x, list) and len(x) == 2 for x in lb):
    ids = sorted(int(x[0]) for x in lb); runs = []
    for t in ids:
        if runs and t == runs[-1][1] + 1: runs[-1][1] = t
        else: runs.append([t, t])
    vals = sorted({json.dumps(x[1]) for x in lb})
    b["logit_bias"] = "%d token ids (%s) set to %s" % (len(ids), ", ".join("%d-%d" % (a, z) if a != z else str(a) for a, z in runs), "/".join(vals))
print(json.dumps(b))' "$EXTRA_BODY" 2>/dev/null || echo "$EXTRA_BODY")"
} > "$OUT/machine.txt" 2>&1

health() { "$PY" -c 'import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)' "$URL"; }

# the pid whose RSS is the server's: the started one, or its llama-server
# child when SHIM_CMD runs it as a child (woffload-run --fit)
server_pid() {
    local p=$1 c
    case "$(readlink "/proc/$p/exe" 2>/dev/null)" in *llama-server*) echo "$p"; return ;; esac
    for c in $(pgrep -P "$p" 2>/dev/null); do
        case "$(readlink "/proc/$c/exe" 2>/dev/null)" in *llama-server*) echo "$c"; return ;; esac
    done
    echo "$p"
}

# SIGTERM and the seconds to exit (SIGKILL after 30 s), into stop.json
stop_server() { # PID TAG
    local pid=$1 tag=$2 t0 t killed=false
    kill -0 "$pid" 2>/dev/null || { log "stop $tag: pid $pid already gone"; return 0; }
    t0=$(date +%s.%N)
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        # a zombie has exited (wait reaps it below)
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
        if ! $killed && awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { exit !(b - a > 30) }'; then
            kill -KILL "$pid"; killed=true
        fi
        sleep 0.05
    done
    t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    wait "$pid" 2>/dev/null; local rc=$?
    log "stop $tag: SIGTERM -> exit in $t s (status $rc, SIGKILL: $killed)"
    printf '{"tag": "%s", "pid": %s, "exit_s": %s, "status": %s, "killed": %s, "within_10s": %s}\n' \
        "$tag" "$pid" "$t" "$rc" "$killed" \
        "$(awk -v t="$t" -v k="$killed" 'BEGIN { print (t <= 10 && k == "false") ? "true" : "false" }')" \
        >> "$OUT/stop.json"
}

# a step's time limit: what is left less RESERVE, and at least 30 s (a
# step that cannot get 30 s is skipped: `timeout 0` would mean no limit)
budget_for() { # NAME RESERVE: sets budget (not in a subshell: STEPS_FAILED must stay)
    budget=$(( $(left) - $2 ))
    if [ "$budget" -lt 30 ]; then STEPS_FAILED+=("$1 (no time left)"); log "$1: SKIPPED: $budget s left for it"; return 1; fi
}

cleanup() { [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null && stop_server "$PID" cleanup; :; }
trap cleanup EXIT

# 1. start, wait for /health. The devices' used memory first (MiB): the rows'
# table takes the server's device memory as the used memory less this (the
# per-process figure leaves out managed memory resident on the device:
# bench/llamacpp-serve-table.py)
# (serve.py's own sampler, so that both figures come from one source)
"$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import serve
g = serve.gpu_used_mib(None)
if g and g.get("device") is not None: print(g["device"])' "$HERE" >"$OUT/gpu-idle-mib" 2>/dev/null
[ -s "$OUT/gpu-idle-mib" ] || rm -f "$OUT/gpu-idle-mib"
log "start: llama-server --parallel $PARALLEL -c $CTX (load timeout $LOAD_TIMEOUT s)"
"${SERVER[@]}" > "$OUT/server-1.log" 2>&1 &
PID=$!
UP=false
for _ in $(seq 1 $((LOAD_TIMEOUT * 4))); do
    if health; then UP=true; break; fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.25
done
SPID=$(server_pid "$PID")
if $UP; then log "start: /health 200 (pid $PID, server pid $SPID)"; else
    STEPS_FAILED+=("start"); log "start: FAILED: no /health 200 (see server-1.log)"; tail -20 "$OUT/server-1.log"; fi

# 2s. the soak, in place of the sweep
if $UP && [ -n "$SOAK_MINUTES" ] && budget_for soak 30; then
    log "soak: $SOAK_MINUTES min at $SOAK_RATE req/s"
    timeout --signal=INT "$budget" "$PY" "$HERE/serve.py" --server-kind llamacpp --url "$URL" \
        --rate "$SOAK_RATE" --soak-minutes "$SOAK_MINUTES" --drain-timeout "$DRAIN" --seed "$SEED" \
        --prompt-len "$PROMPT_LEN" --output-len "$OUTPUT_LEN" --ignore-eos --include-usage \
        --pid "$SPID" --metrics-url "$URL/metrics" --report-every 60 ${STATS:+--stats-file "$STATS"} \
        ${EXTRA_BODY:+--extra-body "$EXTRA_BODY"} --out "$OUT/soak.json" > "$OUT/soak.log" 2>&1
    step_rc soak $?
    grep -E '^\[|^throughput|^  (TTFT|ITL)|^errors|^memory|^server' "$OUT/soak.log" | tee -a "$OUT/llamacpp-serve.log"
    "$PY" "$HERE/serve-plot.py" "$OUT/soak.json" --out "$OUT/soak-memory.png" 2>&1 | tee -a "$OUT/llamacpp-serve.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 3 ]; then log "plot: skipped (no matplotlib for $PY: the samples are in soak.json)"; else step_rc plot "$rc"; fi
fi

# 2. the rate sweep (bounded: what is left, less ~200 s for the faults and the
# stops; 20 s for the stop when FAULTS=0)
SWEEP_RESERVE=200
[ "$FAULTS" = 1 ] || SWEEP_RESERVE=20
if $UP && [ -z "$SOAK_MINUTES" ] && budget_for sweep "$SWEEP_RESERVE"; then
    GREEDY=(--record-greedy "$OUT/greedy.json")
    [ -n "${GREEDY_REF:-}" ] && GREEDY=(--greedy-check "$GREEDY_REF" --greedy-load-check report)
    log "sweep: rates $RATES, $DURATION s each (+ drain <= $DRAIN s), at most $budget s"
    timeout --signal=INT "$budget" "$PY" "$HERE/serve.py" --server-kind llamacpp --url "$URL" \
        --rates "$RATES" --duration "$DURATION" --drain-timeout "$DRAIN" --idle-wait "${IDLE_WAIT:-60}" --seed "$SEED" \
        --prompt-len "$PROMPT_LEN" --output-len "$OUTPUT_LEN" --ignore-eos --include-usage \
        --pid "$SPID" --metrics-url "$URL/metrics" --report-every 5 --bad-request "${GREEDY[@]}" ${STATS:+--stats-file "$STATS"} \
        ${EXTRA_BODY:+--extra-body "$EXTRA_BODY"} --out "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
    step_rc sweep $?
    grep -E '^=== phase|^throughput|^  (TTFT|ITL)|^errors|^  example|^memory|^greedy|^server' "$OUT/sweep.log" | tee -a "$OUT/llamacpp-serve.log"
    "$PY" "$HERE/serve-plot.py" "$OUT/sweep.json" --out "$OUT/sweep-memory.png" 2>&1 | tee -a "$OUT/llamacpp-serve.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 3 ]; then log "plot: skipped (no matplotlib for $PY: the samples are in sweep.json)"; else step_rc plot "$rc"; fi
fi

# 3. the fault checks: this server is signalled (sigterm) and one is started
# again with the same command line (restart)
if kill -0 "$PID" 2>/dev/null && $UP && [ "$FAULTS" = 1 ] && budget_for faults 15; then
    log "faults: at most $budget s"
    timeout --signal=INT "$budget" "$PY" "$HERE/serve-faults.py" --server-kind llamacpp --url "$URL" \
        --pid "$PID" --server-cmd "$SERVER_STR" --parallel "$PARALLEL" --load-timeout "$LOAD_TIMEOUT" \
        ${STATS:+--stats-file "$STATS"} ${EXTRA_BODY:+--extra-body "$EXTRA_BODY"} \
        ${FAULTS_AGAINST:+--against "$FAULTS_AGAINST"} \
        --log-dir "$OUT" --out "$OUT/faults.json" 2>&1 | tee -a "$OUT/llamacpp-serve.log"
    step_rc faults "${PIPESTATUS[0]}"
fi

# 4. whatever is left: SIGTERM, exit time. The first server, unless the
# sigterm check stopped it (then a zombie until reaped here)
if [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null)" = Z ]; then
    wait "$PID" 2>/dev/null; log "stop: the first server exited at the sigterm check (status $?)"
elif kill -0 "$PID" 2>/dev/null; then stop_server "$PID" "after the checks"; fi
# the restarted one, when the faults script was cut before it stopped it
RPID=$(cat "$OUT/restart.pid" 2>/dev/null)
if [ -n "$RPID" ] && kill -0 "$RPID" 2>/dev/null; then
    case "$(readlink "/proc/$RPID/exe" 2>/dev/null)" in "$(readlink "/proc/$PID/exe" 2>/dev/null)"|*llama-server*|*python*)
        stop_server "$RPID" "restarted, left running" ;; esac
fi

# 5. the markdown
"$PY" - "$OUT" "$SERVER_STR" "${STEPS_FAILED[*]:-}" <<'EOF' > "$OUT/llamacpp-serve.md" 2>>"$OUT/llamacpp-serve.log"
import json, os, sys
out, cmd, failed = sys.argv[1], sys.argv[2], sys.argv[3]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
print("# llama-server under load (bench/llamacpp-serve.sh)\n")
try:
    print("```\n" + open(os.path.join(out, "machine.txt")).read().strip() + "\n```\n")
except OSError:
    pass
print(f"server: `{cmd}`\n")
if failed:
    print(f"**failed steps:** {failed}\n")
sw = load("sweep.json") or load("soak.json")
if sw:
    print("| rate req/s (cN: N in flight) | offered | completed | failed | errors | steady tok/s | server step ms | server tok/s (prompt + generated) | steady req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | in flight (mean / max) | RSS MiB (min-max) | GPU MiB, process (min-max) | GPU used MiB, device (min-max) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ph in sw.get("phases") or [sw]:
        s = ph["summary"]; rq = s["requests"]; st = s.get("steady") or {}; m = ph.get("memory") or {}
        c = s["concurrency"]; sv = ph.get("server") or {}
        rng = lambda k, sc: (f"{m[k]['min'] * sc:.0f}-{m[k]['max'] * sc:.0f}" if k in m else "-")
        what = f"c{ph['closed']}" if ph.get("closed") else f"{ph.get('rate', sw['config']['rate']):g}"
        print(f"| {what} | {s['offered_rate']} | {rq['completed']} | {rq['failed']} "
              f"| {json.dumps(s['errors']) if s['errors'] else 0} | {st.get('output_tok_s', '-')} "
              f"| {sv.get('step_ms') or '-'} | {sv.get('processed_tok_s') or '-'} | {st.get('requests_s', '-')} "
              f"| {s['ttft_ms']['p50']} / {s['ttft_ms']['p99']} | {s['itl_ms']['p50']} / {s['itl_ms']['p99']} "
              f"| {c['sampled_in_flight']} / {c['sampled_max']} | {rng('rss_kib', 1 / 1024)} | {rng('gpu_pid_mib', 1)} | {rng('gpu_dev_mib', 1)} |")
    ex = {}
    for ph in sw.get("phases") or [sw]:
        for k, ms in (ph["summary"].get("error_examples") or {}).items():
            ex.setdefault(k, [])
            ex[k] += [m for m in ms if m not in ex[k]][:3 - len(ex[k])]
    if ex:
        print("\nwhat the server said, up to three a kind:\n" + "\n".join(
            f"- {k}: `{m}`" for k, ms in sorted(ex.items()) for m in ms))
    so = load("soak.json")
    if so and so.get("memory"):
        m = so["memory"]
        print("\nsoak memory from minute 1 (issue 40: within 2%): " + ", ".join(
            f"{k} {m[k]['min']}-{m[k]['max']} (spread {m[k]['spread']})" for k in ("rss_kib", "gpu_pid_mib", "gpu_all_mib", "gpu_dev_mib") if k in m)
            + f"; errors {so['summary']['errors'] or 0}")
        print("\n| minute | tok/s | TTFT p99 ms | errors | in flight |\n|---|---|---|---|---|")
        for x in so.get("intervals") or []:
            print(f"| {x['t'] / 60:g} | {x['tok_s']} | {x['ttft_p99_ms']} | {x['errors']} | {x['in_flight']} |")
    g = sw.get("greedy_alone")
    if g:
        print(f"\ngreedy token ids (sent alone after the sweep): {json.dumps(g)}")
    print()
fa = load("faults.json")
if fa:
    print("| fault check | expected | observed | ok |\n|---|---|---|---|")
    for k, r in fa["checks"].items():
        obs = r.get("observed") or r.get("skipped") or r.get("error")
        print(f"| {k} | {r.get('expected', '-')} | `{json.dumps(obs)[:400]}` | {'yes' if r['ok'] else '**NO**'} |")
    print()
stops = []
if fa:
    t = (fa["checks"].get("sigterm") or {}).get("observed") or {}
    if "exit_s" in t:
        stops.append(f"under load (sigterm check): {t['exit_s']} s, within the limit: {t.get('within_limit')}")
    t = ((fa["checks"].get("restart") or {}).get("observed") or {}).get("stop_idle") or {}
    if "exit_s" in t:
        stops.append(f"idle, the restarted server: {t['exit_s']} s, within the limit: {t.get('within_limit')}")
try:
    stops += open(os.path.join(out, "stop.json")).read().strip().splitlines()
except OSError:
    pass
if stops:
    print("SIGTERM to exit:\n" + "\n".join(f"- {x}" for x in stops))
EOF
log "markdown: $OUT/llamacpp-serve.md"
trap - EXIT
if [ ${#STEPS_FAILED[@]} -gt 0 ]; then log "done with failures: ${STEPS_FAILED[*]}"; exit 1; fi
log "done"
