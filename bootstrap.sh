#!/bin/sh
# bootstrap.sh: the README's two commands, on a fresh Debian 12 machine with
# the CUDA toolkit (run as root so missing packages can be installed).
#
#   ./bootstrap.sh demo   build (build/), then run the demo: build/tools/woffload demo
#   ./bootstrap.sh test   build and test five configurations, as CI does: gcc
#                         -Werror (and valgrind on the unit tests), clang
#                         -Werror, release (NDEBUG), ASan+UBSan, TSan; about
#                         26 minutes and 10 GB of memory on 2 cores
#   ./bootstrap.sh deps   install the Debian packages that are missing
#   ./bootstrap.sh build [DIR]
#                         one debug build in DIR (default build/)
#
# CUDA_HOME (default /usr/local/cuda) names the toolkit; only its headers are
# used at build time. Exit status: 0 success, 2 usage error, 1 failure.
#
# `test` runs two configurations at a time, each with half the cores, in
# two lanes that take them from one queue, the longest first; the tests that
# must run alone (is_parallel: false in tests/meson.build: timing checks,
# floods) run afterwards, one configuration at a time. The `once` suite
# runs in the gcc configuration only, the `nothreads` suite everywhere but
# TSan (tests/meson.build says why). Logs: DIR/meson-logs/.
set -eu
cd "$(dirname "$0")"

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PACKAGES="meson ninja-build pkg-config gcc clang libclang-rt-14-dev binutils libyaml-dev zlib1g-dev libcmocka-dev python3 valgrind"

say() { printf 'bootstrap: %s\n' "$*" >&2; }

# the comment at the top, whole
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

deps() {
    missing=""
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        if [ "$(id -u)" -ne 0 ]; then
            say "missing Debian packages:$missing"
            say "run as root, or: sudo apt-get install -y$missing"
            exit 1
        fi
        say "installing:$missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
    if [ ! -f "$CUDA_HOME/include/cuda.h" ]; then
        say "no CUDA toolkit headers at $CUDA_HOME/include/cuda.h: install the CUDA toolkit or set CUDA_HOME"
        exit 1
    fi
}

# setup DIR [meson options...]: configure DIR once, reconfigure when options
# change, build with $JOBS jobs (ninja's default when unset)
setup() {
    dir=$1
    shift
    if [ -f "$dir/build.ninja" ]; then
        meson configure "$dir" "$@" >/dev/null
    else
        meson setup "$dir" -Dcuda-path="$CUDA_HOME" "$@" >/dev/null
    fi
    ninja -C "$dir" ${JOBS:+-j "$JOBS"} >/dev/null || ninja -C "$dir" ${JOBS:+-j 1}
}

now() { date +%s; }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# tests DIR parallel|alone: the names of the default setup's tests (not the
# gpu or valgrind suites) that meson may run beside others, or must run
# alone; the `once` suite (checks no compiled code takes part in) only in
# the first configuration, build-ci-gcc; the `nothreads` suite (the
# single-threaded tools) not under TSan, which finds nothing there
tests() {
    meson introspect --tests "$1" | python3 -c '
import json, sys
want = sys.argv[1] == "parallel"
skip = {"gpu", "valgrind"} | (set() if sys.argv[2] == "build-ci-gcc" else {"once"})
skip |= {"nothreads"} if sys.argv[2] == "build-ci-tsan" else set()
for t in json.load(sys.stdin):
    suites = {s.split(":")[-1] for s in t["suite"]}
    if not suites & skip and t["is_parallel"] == want:
        print(t["name"])' "$2" "$(basename "$1")"
}

# run_tests NAME DIR PROCS MULT LOG [TEST...]: meson test, output to LOG; on
# failure the failed tests' logs go to stderr
run_tests() {
    rt_name=$1 rt_dir=$2 rt_procs=$3 rt_mult=$4 rt_log=$5
    shift 5
    # no names would mean every test
    if [ $# -eq 0 ]; then
        : >"$rt_log"
        return 0
    fi
    # meson-logs/NAME.{txt,json} per run (NAME the log's), kept side by side
    rt_base=$(basename "$rt_log" .log)
    if ! meson test -C "$rt_dir" --print-errorlogs --num-processes "$rt_procs" \
        --timeout-multiplier "$rt_mult" --logbase "$rt_base" "$@" >"$rt_log" 2>&1; then
        grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)' "$rt_log" >&2 || true
        tail -n 60 "$rt_log" >&2
        say "$rt_name: tests failed (logs: $rt_log, $rt_dir/meson-logs/$rt_base.txt)"
        return 1
    fi
}

# config NAME DIR [meson options...]: build, then the tests that may run
# beside others; writes DIR/bootstrap-times (build and test seconds)
config() {
    name=$1 dir=$2
    shift 2
    t0=$(now)
    say "[$name] start"
    echo "$name: building since $(date +%H:%M:%S)" >"$TMPD/phase-$LANE"
    setup "$dir" "$@" || { say "[$name] build failed"; return 1; }
    t1=$(now)
    echo "$name: testing since $(date +%H:%M:%S)" >"$TMPD/phase-$LANE"
    # a failed listing must not pass as "no tests" (errexit is off in here)
    # shellcheck disable=SC2015 # either failure takes the same branch
    list=$(tests "$dir" parallel) && [ -n "$list" ] || { say "[$name] cannot list its tests"; return 1; }
    # shellcheck disable=SC2086 # names have no spaces
    run_tests "$name" "$dir" "$PROCS" 3 "$dir/bootstrap-test.log" $list || return 1
    if [ "$dir" = build-ci-gcc ]; then
        run_tests "valgrind" "$dir" 1 3 "$dir/bootstrap-valgrind.log" --suite valgrind || return 1
    fi
    t2=$(now)
    echo "$((t1 - t0)) $((t2 - t1))" >"$dir/bootstrap-times"
    say "[$name] built in $(mmss $((t1 - t0))), tests in $(mmss $((t2 - t1))) (those that run alone follow)"
}

# take: the next configuration of the queue ("" when it is empty or a lane
# has failed), under a lock (mkdir is atomic)
take() {
    until mkdir "$TMPD/lock" 2>/dev/null; do sleep 1; done
    if [ -f "$TMPD/failed" ]; then
        c=
    else
        c=$(head -n 1 "$TMPD/queue")
        sed -i 1d "$TMPD/queue"
    fi
    rmdir "$TMPD/lock"
    printf '%s' "$c"
}

# lane LABEL: configurations ("NAME|DIR|CC|OPTS") from the queue, one after
# another, until it is empty
lane() {
    label=$1
    LANE=$label
    while c=$(take) && [ -n "$c" ]; do
        IFS='|' read -r name dir cc opts <<EOF
$c
EOF
        # shellcheck disable=SC2086
        CC=$cc config "$name" "$dir" $opts || {
            echo failed >"$TMPD/$label"
            : >"$TMPD/failed"
            return 1
        }
    done
    [ -f "$TMPD/failed" ] && echo stopped >"$TMPD/$label" || echo ok >"$TMPD/$label"
    rm -f "$TMPD/phase-$label"
}

# every 5 minutes, what each lane is doing: no long silence on a slow machine
heartbeat() {
    # sleep without our stdio: killed, the loop leaves no pipe held open
    # shellcheck disable=SC2217
    while sleep 300 </dev/null >/dev/null 2>&1 && [ -d "$TMPD" ]; do
        for f in "$TMPD"/phase-*; do
            [ -f "$f" ] && say "... $(mmss $(($(now) - start))) in: $(cat "$f")"
        done
    done
}

verb=${1:-}
case "$verb" in
deps)
    deps
    ;;
build)
    deps
    setup "${2:-build}"
    ;;
demo)
    deps
    setup build
    shift
    exec ./build/tools/woffload demo "$@"
    ;;
test)
    deps
    start=$(now)
    ncpu=$(nproc 2>/dev/null || echo 2)
    # two lanes, each with half the cores for its build and its tests
    JOBS=$(((ncpu + 1) / 2))
    PROCS=$JOBS
    export JOBS PROCS
    TMPD=$(mktemp -d)
    ph=
    # every command here must succeed: under set -e a failing one (kill of a
    # heartbeat already gone) would turn a passing run's exit status into 1
    trap '[ -z "$ph" ] || kill "$ph" 2>/dev/null || true; rm -rf "$TMPD"' EXIT
    GCC="gcc -Werror|build-ci-gcc|gcc|-Dwerror=true"
    CLANG="clang -Werror|build-ci-clang|clang|-Dwerror=true"
    RELEASE="release (NDEBUG)|build-ci-release|gcc|-Dbuildtype=release -Db_ndebug=true -Dwerror=true"
    ASAN="ASan+UBSan|build-ci-asan|gcc|-Db_sanitize=address,undefined -Db_lundef=false"
    TSAN="TSan|build-ci-tsan|gcc|-Db_sanitize=thread -Db_lundef=false"
    # two lanes take configurations from one queue, the longest first
    # (build + tests, clean clone on 2 cores): whichever lane is free takes
    # the next, so neither waits idle for the other at the end
    printf '%s\n' "$TSAN" "$ASAN" "$GCC" "$CLANG" "$RELEASE" >"$TMPD/queue"
    lane a &
    pa=$!
    lane b &
    pb=$!
    heartbeat &
    ph=$!
    wait $pa || true
    wait $pb || true
    kill $ph 2>/dev/null || true
    ph=
    if [ "$(cat "$TMPD/a" 2>/dev/null)" != ok ] || [ "$(cat "$TMPD/b" 2>/dev/null)" != ok ]; then
        say "failed after $(mmss $(($(now) - start)))"
        exit 1
    fi
    # the tests that must run alone, one configuration at a time, all cores
    for c in "$GCC" "$CLANG" "$RELEASE" "$ASAN" "$TSAN"; do
        IFS='|' read -r name dir cc opts <<EOF
$c
EOF
        t0=$(now)
        list=$(tests "$dir" alone) || { say "[$name] cannot list its tests"; exit 1; }
        # shellcheck disable=SC2086
        run_tests "$name" "$dir" 1 2 "$dir/bootstrap-alone.log" $list || {
            say "failed after $(mmss $(($(now) - start)))"
            exit 1
        }
        echo "$(($(now) - t0))" >>"$dir/bootstrap-times"
        say "[$name] tests that run alone: $(mmss $(($(now) - t0)))"
    done
    say "all configurations passed in $(mmss $(($(now) - start))) on $ncpu cores:"
    for c in "$GCC" "$CLANG" "$RELEASE" "$ASAN" "$TSAN"; do
        IFS='|' read -r name dir cc opts <<EOF
$c
EOF
        read -r b t <"$dir/bootstrap-times"
        a=$(tail -n 1 "$dir/bootstrap-times")
        say "  $(printf '%-18s' "$name") build $(mmss "$b"), tests $(mmss "$t") + $(mmss "$a") alone"
    done
    ;;
-h | --help | help)
    usage
    ;;
*)
    usage >&2
    [ -z "$verb" ] || say "unknown command \"$verb\""
    exit 2
    ;;
esac
