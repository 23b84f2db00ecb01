#!/usr/bin/env bash
# bench/llamacpp-hook.sh: llama.cpp under the shim with the ggml hook, on the
# GPU machine, in one device call (<= 570 s with the build).
#
#   LLAMA_SRC=.peers/llama [PEERS=.peers/llamacpp] [OUT=...] bash bench/llamacpp-hook.sh
#
# LLAMA_SRC: the llama.cpp tree (SERVER=1 peers/llamacpp/make-tree.sh GIT_DIR
# DEST); PEERS: the peers kit (gen_gguf.py); both carried as ignored folders,
# with build-yaml (libyaml for the shim, bench/README.md). Builds llama-server,
# llama-batched-bench and libllama in /tmp/llb (-j16), the random Qwen3-MoE
# GGUF (19.75 GiB) beside it, the shim in build-gpu, all three at once; then,
# each row skipped when the time left is too short, a failed row never
# stopping the rest:
#   tokens-*   bench/llamacpp-tokens.c, 32 greedy token ids (*-b32: of 32
#              sequences side by side, against tokens-plain-b32): plain (twice: the
#              second says whether llama.cpp repeats itself), then under
#              woffload-run (hook loaded by the ELF's NEEDED libllama.so)
#              with the empty policy, experts host (-ot exps=CPU), the first
#              8 layers' experts host (--n-cpu-moe 8), experts host with
#              --no-mmap, experts host staged into slots (exps-stream:
#              examples/llamacpp-exps-stream.yaml): ids must equal plain; the
#              stats must name every GGUF tensor with its policy's placement
#   bench-*    llama-batched-bench -npp 32 -ntg 32 -npl 1,8,32: plain all-GPU,
#              the shim + hook with the same four policies (and experts host
#              with 2 staging slots, bench-shim-exps-slots2), llama.cpp's own
#              -ot exps=CPU and -ncmoe 8 (-lm none: host experts pinned);
#              *-ncmoe8-hotset: the n-cpu-moe 8 policy with streaming off (no
#              staging slots), near -ncmoe 8's device memory; *-buf1: one
#              picked-copy buffer a stream (WOFFLOAD_PICKS_BUFFERS=1): at it
#              (*-buf1-dma: its picked copies on the copy engine)
#   *-noreplay with WOFFLOAD_GRAPH_REPLAY=0 (bench-shim-exps-noreplay: llama.cpp's
#              CUDA graph launches run whole, reading the host experts in
#              place); *-noclaims with WOFFLOAD_GGML_STREAM=0
#              (tokens-exps-stream-noclaims: every step staged, through
#              graph replay when llama.cpp's graphs are on)
#   *-fromN, *-kernel, *-dma, *-engine100: picked copies from a share of
#              N%, by the kernel (the default, or said: -kernel), on the copy
#              engine (-dma), or on it also at shares over WOFFLOAD_GGML_STREAM
#              (picks_env)
#   *-picksN   the same with WOFFLOAD_GGML_PICKS=N (tokens-exps-picks100,
#              bench-shim-exps-picks0, bench-shim-exps-picks100: the router's
#              picks never / always registered; with llama.cpp's CUDA graphs
#              off, GGML_CUDA_DISABLE_GRAPHS=1, for its batched steps to be
#              eager: a captured launch reads in place)
#   *-hotN     N MiB of hot experts, the router's picks registered (the hook's
#              default then: every compute, a single token's too; with -dma the
#              copy engine moves the rows not hot: bench-shim-exps-hot9216-dma,
#              tokens-exps-hot9216-dma-b32)
#              (WOFFLOAD_PICKS_HOT): tokens-exps-hot8704, bench-shim-exps-hot8704
#              (the moe32 GGUF's 18 GiB of experts: about half kept hot, beside
#              -ncmoe 8, half the layers' experts on host, at about the same
#              device memory); tokens-exps-hot9216-b32, bench-shim-exps-hot9216
#              (the same for the moe128 GGUF's 18 GiB: half, 9 GiB, kept hot)
#   *-trace    the shim's event stream recorded to NAME.wot (woffload-run
#              --trace): bench-shim-exps-npl32-trace, b32 alone (*-npl32), for
#              woffload-replay's prediction of the picked copies against the
#              measured step
#   *-blockNN  beside a blocker process holding device memory so that NN% of
#              the GGUF's bytes stay free (a model larger than the GPU, issue
#              41); *-late with WOFFLOAD_LATE_BIND=1; tokens-fit-block50-late,
#              bench-shim-fit-block50-late (--fit ${FIT:-90%}), -exps-block50,
#              -exps-block50-late, bench-llama-ot-exps-block50, and at 25%
#   *-fit      with FIT=SIZE: tokens and a batched-bench row under
#              `woffload-run --fit SIZE` (e.g. the device memory the -ncmoe 8
#              row held: the shim choosing what stays within the same total)
#   server-*   llama-server plain and under the shim (experts host): load,
#              /completion with "return_tokens", token ids compared when both
#              answer 200 (a random model can get 500 from the chat parser,
#              peers/llamacpp/README.md), stop on SIGTERM
# Everything goes to $OUT: one log per row, the stats JSON, summary.txt.
# ROWS="name ..." runs only those rows (see chosen() below).
set -u
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
say() { echo "[$(el)s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((DEADLINE - $(el))); }

cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/llamacpp-hook}
mkdir -p "$OUT"
: >"$OUT/summary.txt"
DEADLINE=${DEADLINE:-570}
PEERS=$(cd "${PEERS:-.peers/llamacpp}" && pwd) || { echo "no peers kit at ${PEERS:-.peers/llamacpp}"; exit 1; }
SRC=$(cd "${LLAMA_SRC:?set LLAMA_SRC to the llama.cpp tree (make-tree.sh)}" && pwd) || exit 1
B=${LLB:-/tmp/llb}
# SHAPE: moe32 (the kit's 32 experts top-4) or moe128 (128 experts top-8,
# Qwen3-30B-A3B's layer): bench/gguf-shape.py
SHAPE=${SHAPE:-moe32}
case $SHAPE in
moe32) M=${GGUF:-/tmp/x.gguf} ;;
moe128) M=${GGUF:-/tmp/x-moe128.gguf} ;;
*) echo "SHAPE=$SHAPE: expected moe32 or moe128"; exit 2 ;;
esac
BIN=$B/bin
TOK=$B/llamacpp-tokens
RUN=$ROOT/build-gpu/tools/woffload-run
POL_EMPTY=$ROOT/examples/empty.yaml
POL_EXPS=$ROOT/examples/llamacpp-ot-exps-cpu.yaml
POL_NCMOE=$ROOT/examples/llamacpp-n-cpu-moe.yaml
POL_STREAM=$ROOT/examples/llamacpp-exps-stream.yaml

# libyaml (and cmocka) of the GPU machine: unpacked Debian packages (bench/README.md)
pc=$ROOT/build-yaml/root/usr/lib/x86_64-linux-gnu
if [ -d "$pc/pkgconfig" ]; then
    export PKG_CONFIG_PATH=$pc/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$pc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

{
    echo "# llamacpp-hook: $(date -u '+%Y-%m-%d %H:%M UTC'), commit ${WO_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv,noheader 2>&1
    echo "cores $(nproc); LLAMA_SRC=$SRC; SHAPE=$SHAPE; GGUF=$M"
} | tee -a "$OUT/summary.txt"

# ---- build: llama.cpp, the GGUF and the shim at once ---------------------------------
# A llama.cpp built on an earlier machine (bench/llamacpp-device.sh pack:
# $B/bin and the CPU it was built for, LLAMA_PREBUILT, by default
# .peers/llb-bin.txz, carried) saves the build's ~335 s: used when this
# machine's CPU has the same flags (the build is -march=native, as users
# build it, so the CPU backend's figures stay the peer's own), else built.
PREBUILT=${LLAMA_PREBUILT:-$ROOT/.peers/llb-bin.txz}
cpu_key() { grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-16; }
(
    if [ ! -x "$BIN/llama-batched-bench" ] && [ -s "$PREBUILT" ]; then
        mkdir -p "$B" && tar xJf "$PREBUILT" -C "$B"
        if [ "$(cat "$B/cpu-key" 2>/dev/null)" = "$(cpu_key)" ] && "$BIN/llama-batched-bench" --help >/dev/null 2>&1; then
            echo "llama.cpp from $PREBUILT (built for this CPU)"
        else
            echo "$PREBUILT: built for another CPU (or does not run here): building"
            rm -rf "$B/bin" "$B/cpu-key"
        fi
    fi
    if [ -x "$BIN/llama-batched-bench" ] && [ -x "$BIN/llama-server" ]; then
        echo "llama.cpp already built in $B"
    else
        cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_COMMIT=34af94cd -DLLAMA_BUILD_NUMBER=10470 &&
            cmake --build "$B" --target llama-server llama-batched-bench llama -j16 &&
            cpu_key >"$B/cpu-key"
    fi
) >"$OUT/build-llama.log" 2>&1 &
LLAMA_PID=$!
(
    if [ -s "$M" ]; then
        echo "GGUF $M exists"
    else
        GGUF_PY=$SRC/gguf-py PEERS=$PEERS PYTHONUNBUFFERED=1 python3 bench/gguf-shape.py "$SHAPE" "$M.part" && mv "$M.part" "$M"
    fi
) >"$OUT/gen.log" 2>&1 &
GEN_PID=$!
(
    [ -f build-gpu/build.ninja ] ||
        meson setup build-gpu -Dtests=disabled -Dcuda-path="${CUDA_HOME:-/usr/local/cuda}"
    nice ninja -C build-gpu -j4
) >"$OUT/build-shim.log" 2>&1
say "shim build rc=$? ($(ls build-gpu/ggml/libwoffload-ggml.so 2>/dev/null || echo 'no hook built'))"
wait $GEN_PID
say "GGUF rc=$? ($(du -h "$M" 2>/dev/null | cut -f1))"
last=$(el)
while kill -0 $LLAMA_PID 2>/dev/null; do # progress while llama.cpp builds (~4.5 min)
    sleep 2
    if [ $(($(el) - last)) -ge 30 ]; then
        last=$(el)
        say "llama.cpp build: $(grep -o '^\[[0-9]*/[0-9]*\]' "$OUT/build-llama.log" | tail -1)"
    fi
done
wait $LLAMA_PID
rc=$?
say "llama.cpp build rc=$rc"
[ $rc -eq 0 ] || { tail -30 "$OUT/build-llama.log"; exit 1; }
[ -x "$RUN" ] || { tail -30 "$OUT/build-shim.log"; exit 1; }
[ -s "$M" ] || { tail -30 "$OUT/gen.log"; exit 1; }
cc -O2 -I"$SRC/include" -I"$SRC/ggml/include" bench/llamacpp-tokens.c -L"$BIN" -lllama \
    -Wl,-rpath,"$BIN" -ldl -o "$TOK" >"$OUT/build-tokens.log" 2>&1
say "tokens program rc=$? ($(readelf -d "$TOK" 2>/dev/null | grep -c NEEDED) NEEDED)"

# ---- checks ------------------------------------------------------------------------
# check_stats FILE MODE: every GGUF name the shim holds has the placement MODE's
# policy gives it (empty: unplaceable, the bytes pass through), and there are some
check_stats() {
    python3 - "$1" "$2" <<'EOF'
import json, re, sys
path, mode = sys.argv[1], sys.argv[2]
try:
    s = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"stats: cannot read {path}: {e}"); sys.exit(1)
names = [n for n in s.get("names", []) if re.match(r"^(blk\.[0-9]+\.|token_embd\.|output)", n["name"])]
# at exit llama.cpp has freed its model (names are the live ones): the
# rules' cumulative counts still say what was named and where it went
rules = s.get("rules", [])
print("stats: rules: " + "; ".join(f"{r['label']} -> {r['placement']}: {r['names']} names "
                                     f"{r['bytes'] / 2**30:.2f} GiB" for r in rules))
if mode == "fit":
    f = s.get("fit", {})
    print("stats: fit: " + ", ".join(f"{k} {f[k] / 2**30:.2f} GiB" for k in
          ("budget", "device_bytes", "rest_bytes", "engine_bytes", "staging_bytes", "reserve_bytes",
           "lent_bytes", "returned_bytes")
          if isinstance(f.get(k), (int, float))))
    if not names:
        print("stats: no live names (the model was freed); judged by fit's device bytes")
        sys.exit(0 if f.get("device_bytes", 0) > 0 else 1)
if not names:
    want_rule = {"exps": "'exps'", "exps-stream": "'exps'", "exps-slots2": "'exps'",
                 "ncmoe8": "'experts-of-layers-0-7'",
                 "ncmoe9-slots2": "'experts-of-layers-0-8'",
                 "ncmoe8-hotset": "'experts-of-layers-0-7'"}.get(mode)
    hit = [r for r in rules if want_rule and want_rule in r["label"] and r["names"] > 0]
    print(f"stats: no live names (the model was freed); judged by the rules: "
          f"{'ok' if hit or mode == 'empty' else 'NOTHING NAMED by ' + str(want_rule)}")
    sys.exit(0 if hit or mode == "empty" else 1)
def want(n):  # the placements the mode accepts for name n
    if mode == "fit":  # fit chooses: every name placed (managed is fit's own choice too), none unplaceable
        return ("device", "host", "managed")
    if mode == "empty":
        return ("unplaceable",)
    if mode in ("exps", "exps-stream", "exps-slots2"):
        return ("host",) if re.search(r"\.ffn_.*_exps\.", n) else ("device",)
    if mode in ("ncmoe8", "ncmoe9-slots2", "ncmoe8-hotset"):
        last = "8" if mode == "ncmoe9-slots2" else "7"
        return ("host",) if re.match(r"^blk\.[0-" + last + r"]\.ffn_(up|down|gate|gate_up)_(ch|)exps", n) else ("device",)
bad = [n for n in names if n["placement"] not in want(n["name"])]
by = {}
for n in names:
    p = by.setdefault(n["placement"], [0, 0, 0])
    p[0] += 1; p[1] += n.get("bytes", 0); p[2] += n.get("launches", 0)
print(f"stats: {len(names)} GGUF names; " + "; ".join(
    f"{k}: {v[0]} tensors {v[1] / 2**30:.2f} GiB, {v[2]} launches" for k, v in sorted(by.items())))
st = s.get("stream", {})
print("stats: stream: " + ", ".join(f"{k} {st.get(k)}" for k in
      ("sub_spans", "redirected", "staged", "staged_bytes", "staged_pinned", "staged_by_kernel",
       "inplace_no_slot", "inplace_captured", "inplace_claims", "inplace_claimed", "steps",
       "slot_bytes", "auto_tries", "auto_kept", "staging_gbs", "copies_busy_gbs")))
mc = s.get("managed_cap", {})
print(f"stats: managed_cap pinned {mc.get('pinned')} passed {mc.get('passed')}; "
      f"launches {s.get('launches')}; ring dropped {s.get('ring', {}).get('dropped')}")
for n in bad[:5]:
    print(f"stats: MISPLACED {n['name']}: {n['placement']}, wanted {' or '.join(want(n['name']))}")
sys.exit(1 if bad or not names else 0)
EOF
}

# exps-slots2: the experts-host policy (auto) with two staging slots, the
# least that overlaps a copy with the kernels: the slots' device memory
# counts in the equal-memory comparison with llama.cpp's -ot exps=CPU
POL_SLOTS2=$OUT/llamacpp-exps-slots2.yaml
sed 's/^default: device$/default: device\nprefetch:\n  slots: 2/' "$POL_EXPS" >"$POL_SLOTS2"
# ncmoe9-slots2: layers 0-8's experts host and two staging slots, for a row
# at llama.cpp's -ncmoe 8 device memory: the shim's n-cpu-moe 8 row held
# 1,994 MiB more (four 384 MiB slots for the prompt's whole-tensor staging,
# 768 MiB of picks buffers, against llama.cpp's 360 MiB larger compute
# buffer), and one more layer's experts (1,152 MiB on the moe128 GGUF) and
# two slots fewer (768 MiB) leave it at about the same
POL_NCMOE9=$OUT/llamacpp-n-cpu-moe9-slots2.yaml
sed "s/layers-0-7/layers-0-8/; s/\[0-7\]/[0-8]/; s/^default: device\$/default: device\nprefetch:\n  slots: 2/" \
    "$POL_NCMOE" >"$POL_NCMOE9"
# ncmoe8-hotset: layers 0-7's experts host with streaming off (prefetch mode
# hot-set: no staging slots; the prompt's ubatches read them in place), the
# same split as -ncmoe 8 at its memory but for the 768 MiB of picks buffers
POL_NCMOE8H=$OUT/llamacpp-n-cpu-moe-hotset.yaml
sed "s/^default: device\$/default: device\nprefetch:\n  mode: hot-set/" "$POL_NCMOE" >"$POL_NCMOE8H"
declare -A POL=([empty]=$POL_EMPTY [exps]=$POL_EXPS [ncmoe8]=$POL_NCMOE [exps-stream]=$POL_STREAM
    [exps-slots2]=$POL_SLOTS2 [ncmoe9-slots2]=$POL_NCMOE9 [ncmoe8-hotset]=$POL_NCMOE8H)
# shim_args MODE: the launcher's placement arguments in SHIM (an array): the
# mode's policy, or for MODE fit `--fit $FIT` (FIT: a size, e.g. the device
# memory a llama.cpp row was measured to hold, for a row at equal memory)
shim_args() {
    if [ "$1" = fit ]; then SHIM=(--fit "${FIT:-90%}"); else SHIM=(--policy "${POL[$1]}"); fi
}
# a row named ...-picksN runs with WOFFLOAD_GGML_PICKS=N (the ggml hook's
# router picks: 0 never, 100 always; docs/llamacpp.md, "Picked experts")
picks_env() {
    local p=${1##*-picks}
    case $1 in *-picks[0-9]*) PENV=(env "WOFFLOAD_GGML_PICKS=${p%%-*}") ;; *) PENV=() ;; esac
    # *-hotN: the router's picks always registered and N MiB of hot experts
    # (WOFFLOAD_PICKS_HOT, docs/picks.md "Hot experts": llama.cpp's graph
    # launches then replayed, the picked rows copied, the hot ones from the
    # device)
    # (the hook's default with hot experts: every compute registered, a
    # single token's too, since 2026-12-05; -hot9216-picks100 is the same)
    case $1 in *-hot[0-9]*)
        local h=${1##*-hot}
        PENV+=("WOFFLOAD_PICKS_HOT=${h%%-*}") ;;
    esac
    # *-noreplay: CUDA graph launches run whole (read in place); *-noclaims:
    # the ggml hook never claims a layer read in place
    case $1 in *-noreplay*) PENV=(env WOFFLOAD_GRAPH_REPLAY=0) ;; esac
    case $1 in *-noclaims*) PENV=(env WOFFLOAD_GGML_STREAM=0) ;; esac
    # *-fromN: the layers whose share is at least N% (and under
    # WOFFLOAD_GGML_STREAM) registered (WOFFLOAD_GGML_PICKS_FROM=N), their
    # picked runs copied by the kernel (the default) or, *-dma, on the copy
    # engine (WOFFLOAD_PICKS_ENGINE=50); *-kernel: the kernel said explicitly
    # (WOFFLOAD_PICKS_ENGINE=0); *-engine100: on the copy engine with the
    # whole-staging share off (WOFFLOAD_GGML_STREAM=100), every compute
    # registered from N (default 1: every one) so a batch picking 99% goes to
    # the copy engine too
    case $1 in *-from[0-9]*)
        local n=${1##*-from}
        PENV=(env "WOFFLOAD_GGML_PICKS_FROM=${n%%-*}") ;;
    esac
    case $1 in *-kernel*) PENV+=(WOFFLOAD_PICKS_ENGINE=0) ;; esac
    case $1 in *-dma*) PENV+=(WOFFLOAD_PICKS_ENGINE=50) ;; esac
    case $1 in *-engine100*)
        [ ${#PENV[@]} -gt 0 ] || PENV=(env WOFFLOAD_GGML_PICKS_FROM=1)
        PENV+=(WOFFLOAD_GGML_STREAM=100 WOFFLOAD_PICKS_ENGINE=50) ;;
    esac
    # *-late: llama.cpp's model buffer late bound (WOFFLOAD_LATE_BIND=1: a VMM
    # range re-backed at seal, docs/placement.md): without it a buffer larger
    # than the free memory is served as pinned host memory whole
    case $1 in *-late*) PENV+=(WOFFLOAD_LATE_BIND=1) ;; esac
    # *-buf1: one picked-copy buffer a stream (WOFFLOAD_PICKS_BUFFERS=1): one
    # expert tensor's bytes less of device memory
    case $1 in *-buf1*) PENV+=(WOFFLOAD_PICKS_BUFFERS=1) ;; esac
    [ ${#PENV[@]} -eq 0 ] || [ "${PENV[0]}" = env ] || PENV=(env "${PENV[@]}")
}

# *-blockNN rows run beside a blocker: another process holding device
# memory so that NN% of the GGUF's bytes stay free (issue 41: a model larger
# than the GPU); the rows' memory figures leave it out, and the blocker
# (bench/blocker.py) says the most memory the row's process held meanwhile,
# sampled every 5 ms (the row's "peak used by others")
BLOCK_PID=""
blocker_start() {
    local name=$1 pct gg w=0
    case $name in *-block[0-9]*) pct=${name##*-block}; pct=${pct%%-*} ;; *) return ;; esac
    gg=$(stat -c %s "$M")
    python3 "$ROOT/bench/blocker.py" --leave $((gg * pct / 100)) >"$OUT/$name.blocker" 2>&1 &
    BLOCK_PID=$!
    while ! grep -q '^holds' "$OUT/$name.blocker" 2>/dev/null && kill -0 $BLOCK_PID 2>/dev/null &&
        [ $w -lt 120 ]; do
        sleep 0.5
        w=$((w + 1))
    done
    say "$name: blocker $(head -1 "$OUT/$name.blocker") (target: $pct% of the GGUF's $((gg >> 20)) MiB free)"
}
blocker_stop() {
    [ -n "$BLOCK_PID" ] || return
    kill -TERM $BLOCK_PID 2>/dev/null
    wait $BLOCK_PID 2>/dev/null
    BLOCK_PID=""
    say "    $(grep -m1 '^blocker: free at start' "$OUT/$1.blocker" 2>/dev/null)"
}
PLAIN_TOKENS=""
PLAIN_TOKENS_B32=""
FAILS=0

# ROWS="tokens-plain bench-shim-exps ...": only those rows (default: all). A
# second call on a machine still warm reuses /tmp/llb and the GGUF, so rows
# skipped for time can be run then (tokens-plain first: the others compare
# with it).
chosen() {
    case " ${ROWS:-all} " in *" all "* | *" $1 "*) return 0 ;; esac
    return 1
}

# tokens NAME MODE|plain [nommap]
tokens() {
    local name=tokens-$1 mode=$2 mm=${3:-mmap} lim
    chosen "$name" || return
    lim=$(($(left) - 15)) # timeout's -k 10 included
    [ $lim -gt 90 ] && lim=90
    if [ $lim -lt 20 ]; then say "SKIP $name: $(left) s left"; return; fi
    # *-b32: 32 sequences side by side (a step reads 99% of the experts:
    # staged, through graph replay with llama.cpp's graphs on), against
    # tokens-plain-b32
    local seqs=1
    case $name in *-b32*) seqs=32 ;; esac
    local cmd=("$TOK" "$M" 32 "$mm" "$seqs")
    if [ "$mode" != plain ]; then
        shim_args "$mode"
        picks_env "$name"
        cmd=("${PENV[@]}" env WO_TOKENS_STATS="$OUT/$name.live.json" "$RUN" "${SHIM[@]}"
            --stats "$OUT/$name.stats.json" --log info -- "${cmd[@]}")
    fi
    # the token line on stdout alone: the shim's stderr lines, written
    # meanwhile, broke it in two in a shared file
    blocker_start "$name"
    timeout -k 10 $lim "${cmd[@]}" >"$OUT/$name.out" 2>"$OUT/$name.log"
    local rc=$? got
    blocker_stop "$name"
    cat "$OUT/$name.out" >>"$OUT/$name.log"
    got=$(grep -m1 -o '^tokens:[ 0-9|]*' "$OUT/$name.out")
    # the plain run this one is held against: the first plain one of as many
    # sequences
    local -n want=PLAIN_TOKENS
    [ "$seqs" -gt 1 ] && local -n want=PLAIN_TOKENS_B32
    if [ "$mode" = plain ] && [ -z "$want" ]; then
        want=$got
        say "$name rc=$rc: ${got:0:200}"
        [ -n "$got" ] || FAILS=$((FAILS + 1))
        return
    fi
    local verdict="tokens IDENTICAL to plain"
    if [ -z "$got" ] || [ "$got" != "$want" ]; then
        verdict="tokens DIFFER from plain (${got:-none})"
        FAILS=$((FAILS + 1))
    fi
    say "$name rc=$rc: $verdict"
    [ "$mode" = plain ] && return # plain twice: is greedy decoding repeatable at all?
    grep -E "ggml hook|woffload: ggml:|woffload: seal|managed cap|error" "$OUT/$name.log" | head -8 | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    check_stats "$OUT/$name.live.json" "$mode" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || FAILS=$((FAILS + 1))
}

# bench NAME MODE|plain [llama.cpp args...]
bench() {
    local name=bench-$1 mode=$2 lim
    shift 2
    chosen "$name" || return
    lim=$(($(left) - 15))
    [ $lim -gt 120 ] && lim=120
    if [ $lim -lt 30 ]; then say "SKIP $name: $(left) s left"; return; fi
    # *-npl32: batches of 32 only (one step shape: a trace of it is one
    # kind of step for the replay)
    local npl=1,8,32
    case $name in *-npl32*) npl=32 ;; esac
    local cmd=("$BIN/llama-batched-bench" -m "$M" -ngl 99 -fa on -npp 32 -ntg "${NTG:-32}" -c 4096 -npl "$npl" -lv 4 "$@")
    if [ "$mode" != plain ]; then
        shim_args "$mode"
        # *-trace: the event stream recorded (woffload-run --trace) to
        # NAME.wot, for woffload-replay against the row's own figures
        case $name in *-trace*) SHIM+=(--trace "$OUT/$name.wot") ;; esac
        picks_env "$name"
        cmd=("${PENV[@]}" "$RUN" "${SHIM[@]}" --stats "$OUT/$name.stats.json" --log info -- "${cmd[@]}")
    fi
    local base
    blocker_start "$name"
    base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    timeout -k 10 $lim "${cmd[@]}" >"$OUT/$name.log" 2>&1 &
    local pid=$! peak
    # the process's device memory (weights, KV, compute buffers, the shim's
    # staging and context), sampled each second; the one GPU runs one of
    # these rows at a time. Two figures: nvidia-smi's per-process one, which
    # leaves out managed memory resident on the device (the shim's model
    # buffer), and the GPU's used memory less what was used before the row
    # started, which counts it
    peak=$(while kill -0 $pid 2>/dev/null; do
        echo "p $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | awk -F', *' -v k="${BLOCK_PID:-0}" '$1 != k { s += $2 } END { print s + 0 }')"
        echo "g $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)"
        sleep 1
    done | awk -v b="${base:-0}" '$1 == "p" { if ($2 > p) p = $2 } $1 == "g" { if ($2 - b > g) g = $2 - b } END { printf "%d MiB per process, %d MiB of the GPU used memory", p, g }')
    wait $pid
    local rc=$?
    blocker_stop "$name"
    say "$name rc=$rc (limit ${lim}s), device memory peak: ${peak}"
    grep -E "model buffer size|KV buffer size|compute buffer size|woffload: ggml:|woffload: seal|managed cap" "$OUT/$name.log" | head -9 | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    grep -E '^\|' "$OUT/$name.log" | tee -a "$OUT/summary.txt"
    if [ "$mode" != plain ] && [ -f "$OUT/$name.stats.json" ]; then
        check_stats "$OUT/$name.stats.json" "$mode" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    fi
}

# http URL [OUTFILE JSON]: GET (or POST JSON) with python's urllib (no curl
# needed); prints the HTTP status, exit 0 on 200
http() {
    python3 - "$@" <<'EOF'
import sys, urllib.error, urllib.request
url = sys.argv[1]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
except Exception as e:
    code, body = "none", str(e).encode()
if len(sys.argv) > 2:
    open(sys.argv[2], "wb").write(body)
print(code)
sys.exit(0 if code == 200 else 1)
EOF
}

# server NAME MODE|plain: start, one /completion, SIGTERM
SERVER_TOKENS=""
server() {
    local name=server-$1 mode=$2 port=$((18080 + RANDOM % 1000)) lim
    chosen "$name" || return
    lim=$(($(left) - 20))
    [ $lim -gt 90 ] && lim=90
    if [ $lim -lt 30 ]; then say "SKIP $name: $(left) s left"; return; fi
    local cmd=("$BIN/llama-server" -m "$M" -ngl 99 -fa on -c 4096 -np 1 --host 127.0.0.1 --port "$port")
    if [ "$mode" != plain ]; then
        shim_args "$mode"
        cmd=("$RUN" "${SHIM[@]}" --stats "$OUT/$name.stats.json" --log info -- "${cmd[@]}")
    fi
    "${cmd[@]}" >"$OUT/$name.log" 2>&1 &
    local pid=$! t=0 up=0
    while [ $t -lt $((lim - 15)) ]; do
        if http "http://127.0.0.1:$port/health" >/dev/null 2>&1; then up=1; break; fi
        kill -0 $pid 2>/dev/null || break
        sleep 1; t=$((t + 1))
    done
    local code=none got=""
    if [ $up -eq 1 ]; then
        code=$(http "http://127.0.0.1:$port/completion" "$OUT/$name.json" \
            '{"prompt": [97, 194, 291, 388, 485, 582, 679, 776], "n_predict": 32, "temperature": 0, "top_k": 1, "seed": 1, "cache_prompt": false, "return_tokens": true}')
        got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("tokens"))' "$OUT/$name.json" 2>/dev/null)
    fi
    kill -TERM $pid 2>/dev/null
    local w=0
    while kill -0 $pid 2>/dev/null && [ $w -lt 15 ]; do sleep 1; w=$((w + 1)); done
    kill -0 $pid 2>/dev/null && { kill -KILL $pid; say "$name: still running 15 s after SIGTERM: killed"; }
    wait $pid 2>/dev/null
    local verdict=""
    if [ "$mode" = plain ]; then
        SERVER_TOKENS=$got
    elif [ "$code" = 200 ] && [ -n "$SERVER_TOKENS" ] && [ "$got" != "None" ]; then
        if [ "$got" = "$SERVER_TOKENS" ]; then verdict="; tokens IDENTICAL to plain"; else verdict="; tokens DIFFER from plain"; FAILS=$((FAILS + 1)); fi
    fi
    say "$name: up=$up after ${t}s, /completion HTTP $code, tokens ${got:-none}$verdict; stopped ${w}s after SIGTERM"
    grep -E "ggml hook|woffload: ggml:|woffload: seal|model buffer size" "$OUT/$name.log" | head -6 | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    if [ "$mode" != plain ] && [ -f "$OUT/$name.stats.json" ]; then
        check_stats "$OUT/$name.stats.json" "$mode" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    fi
}

say "runs begin"
# correctness first (tokens, the server), then the benchmark rows
tokens plain plain
tokens plain-again plain
tokens empty empty
tokens exps exps
tokens ncmoe8 ncmoe8
tokens exps-nommap exps nommap
tokens exps-stream exps-stream
tokens exps-picks100 exps
tokens exps-hot8704 exps
tokens exps-stream-noclaims exps-stream
tokens plain-b32 plain
tokens exps-hot9216-b32 exps
tokens exps-hot9216-picks100-b32 exps
tokens exps-hot9216-dma-b32 exps
tokens ncmoe8-b32 ncmoe8
tokens ncmoe9-slots2-b32 ncmoe9-slots2
tokens ncmoe8-hotset-b32 ncmoe8-hotset
tokens ncmoe8-hotset-buf1-b32 ncmoe8-hotset
tokens ncmoe8-hotset-buf1-dma-b32 ncmoe8-hotset
tokens exps-stream-b32 exps-stream
tokens exps-b32 exps
tokens exps-from50-b32 exps
tokens exps-from50-dma-b32 exps
tokens exps-engine100-b32 exps
server plain plain
server exps exps
bench plain-allgpu plain
bench shim-empty empty
bench shim-exps exps
bench shim-exps-stream exps-stream
bench shim-exps-slots2 exps-slots2
bench shim-exps-noreplay exps
bench shim-exps-from50 exps
bench shim-exps-from50-kernel exps
bench shim-exps-from50-dma exps
bench shim-exps-engine100 exps
bench shim-exps-picks0 exps
bench shim-exps-picks100 exps
bench shim-exps-hot8704 exps
bench shim-exps-hot9216 exps
bench shim-exps-hot9216-picks100 exps
bench shim-exps-hot9216-dma exps
bench shim-exps-npl32-trace exps
bench llama-ot-exps plain -ot exps=CPU -lm none
bench shim-ncmoe8 ncmoe8
bench shim-ncmoe9-slots2 ncmoe9-slots2
bench shim-ncmoe8-hotset ncmoe8-hotset
bench shim-ncmoe8-hotset-buf1 ncmoe8-hotset
bench shim-ncmoe8-hotset-buf1-dma ncmoe8-hotset
bench llama-ncmoe8 plain -ncmoe 8 -lm none
# a model larger than the GPU (issue 41): a blocker leaving 50% or 25% of the
# GGUF's bytes free; fit (FIT, default 90%: all that is free) late bound,
# the experts-host policy with and without late binding, llama.cpp's own
tokens fit-block50-late fit
tokens fit-block25-late fit
bench shim-fit-block50-late fit
bench shim-exps-block50 exps
bench shim-exps-block50-late exps
bench llama-ot-exps-block50 plain -ot exps=CPU -lm none
bench shim-fit-block25-late fit
bench shim-exps-block25-late exps
bench llama-ot-exps-block25 plain -ot exps=CPU -lm none
# fit at the device memory llama.cpp's -ncmoe 8 row held (FIT, measured):
# the shim chooses what stays by value within the same total
if [ -n "${FIT:-}" ]; then
    tokens fit fit
    bench shim-fit fit
elif chosen tokens-fit || chosen bench-shim-fit; then
    say "SKIP the fit rows: FIT (the fit size) not set"
fi
say "done: $FAILS failed checks"
exit $((FAILS > 0))
