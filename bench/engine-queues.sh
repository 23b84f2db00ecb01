#!/usr/bin/env bash
# bench/engine-queues.sh: stream-gpu's copy-engine row (moe128-host-picks-engine)
# under several CUDA_DEVICE_MAX_CONNECTIONS values at once, on the GPU machine
# after `bench/llamacpp-device.sh shim`: does the row's hang follow the
# driver's work queues (streams share one when there are more streams than
# connections, and a stream wait then holds every stream of its queue)?
#
#   OUT=$OUT bash bench/engine-queues.sh [LIMIT_S [VALUES]]
#
# VALUES (space-separated, [default 32 1]): "default" leaves the variable
# unset; an item VAR=V[,VAR2=V2...] leaves it unset and sets those instead
# (e.g. CUDA_MODULE_LOADING=EAGER); an item given twice runs twice. Each row's test log in $OUT/q-VALUE/test.log; a row whose shim
# reports the copy engine stuck gets every thread's stack
# (bench/stall-stacks.sh, then killed) in $OUT/q-VALUE/. Rows run at once.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?OUT}"
limit=${1:-300}
pc=$PWD/build-yaml/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$pc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
py=/opt/torch/.venv/bin/python3
[ -x "$py" ] || py=python3
pids=()
n=0
for v in ${2:-default 32 1}; do
    n=$((n + 1))
    d=$OUT/q-$n-${v//[^A-Za-z0-9_=.-]/_}
    mkdir -p "$d"
    (
        case $v in
        default) unset CUDA_DEVICE_MAX_CONNECTIONS ;;
        *=*)
            unset CUDA_DEVICE_MAX_CONNECTIONS
            IFS=, read -ra kv <<<"$v"
            for a in "${kv[@]}"; do export "${a?}"; done
            ;;
        *) export CUDA_DEVICE_MAX_CONNECTIONS=$v ;;
        esac
        export WOFFLOAD_LOG_FILE=$d/shim.log
        # stacks at the first report, or 20 s before the limit (a hang the shim does not see)
        STALL_AT_END=1 STALL_KILL=1 bash bench/stall-stacks.sh "$WOFFLOAD_LOG_FILE" "$d" 'looks stuck' $((limit - 20)) \
            >"$d/watch.log" 2>&1 &
        w=$!
        WO_GPU_TESTS=1 timeout "$limit" "$py" tests/gpu/test-stream-gpu.py build-gpu/tools/woffload-run \
            moe128-host-picks-engine >"$d/test.log" 2>&1
        echo "rc $?" >>"$d/test.log"
        kill "$w" 2>/dev/null
    ) &
    pids+=($!)
done
wait "${pids[@]}"
for d in "$OUT"/q-*; do
    echo "== ${d##*/}: $(tail -1 "$d/test.log"), $(grep -c '^ok:' "$d/test.log") ok, $(grep -c '^FAIL' "$d/test.log") FAIL"
    grep -h 'looks stuck\|copy engine' "$d/shim.log" "$d/test.log" 2>/dev/null | head -3 | cut -c1-400
done
# one file back (a call brings 8)
(cd "$OUT" && tar czf engine-queues.tgz q-* && rm -rf q-*)
