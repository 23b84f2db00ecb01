#!/bin/sh
# bootstrap.sh: the README's two commands, on a fresh Debian 12 machine with
# the CUDA toolkit (run as root so missing packages can be installed).
#
#   ./bootstrap.sh demo   build (build/), then run the demo: build/tools/woffload demo
#   ./bootstrap.sh test   build and test five configurations, as CI does: gcc
#                         -Werror (and valgrind on the unit tests), clang
#                         -Werror, release (NDEBUG), ASan+UBSan, TSan; about
#                         17-20 minutes and 10 GB of memory on 2 cores
#   ./bootstrap.sh deps   install the Debian packages that are missing
#   ./bootstrap.sh build [DIR]
#                         one debug build in DIR (default build/)
#
# CUDA_HOME (default /usr/local/cuda) names the toolkit; only its headers are
# used at build time. Exit status: 0 success, 2 usage error, 1 failure.
#
# `test` runs two lanes, each with half the cores, that take work from one
# queue: a configuration's build, then its tests in two halves that either
# lane may take once the build is done (and valgrind in the gcc
# configuration), the longest configurations first. The tests that must run
# alone (is_parallel: false in tests/meson.build: timing checks, floods) run
# after the lanes, one configuration at a time, but for the `quiet` suite
# (timing checks against a server of their own, mostly asleep, with room
# for a loaded machine): those start side by side, beside the lanes, once
# their configuration is built. The `once` suite runs in the gcc
# configuration only, the `nothreads` suite everywhere but TSan
# (tests/meson.build says why). Logs: DIR/meson-logs/.
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

# lists DIR: the names of the default setup's tests (not the gpu or
# valgrind suites), one a line, in DIR/bootstrap-list-parallel (those meson
# may run beside others), DIR/bootstrap-list-alone (those that must run
# alone, the `quiet` suite left out) and DIR/bootstrap-list-quiet (those
# that must run alone but may run beside each other); the `once` suite
# (checks no compiled code takes part in) only in the first configuration,
# build-ci-gcc; the `nothreads` suite (the single-threaded tools) not under
# TSan, which finds nothing there. Once per configuration: each python3
# start costs dozens of processes behind a pyenv shim.
lists() {
    meson introspect --tests "$1" | python3 -c '
import json, sys
d = sys.argv[1]
skip = {"gpu", "valgrind"} | (set() if sys.argv[2] == "build-ci-gcc" else {"once"})
skip |= {"nothreads"} if sys.argv[2] == "build-ci-tsan" else set()
out = {"parallel": [], "alone": [], "quiet": []}
for t in json.load(sys.stdin):
    suites = {s.split(":")[-1] for s in t["suite"]}
    if suites & skip:
        continue
    kind = "parallel" if t["is_parallel"] else "quiet" if "quiet" in suites else "alone"
    out[kind].append(t["name"])
for kind, names in out.items():
    with open(d + "/bootstrap-list-" + kind, "w") as f:
        f.write("".join(n + "\n" for n in names))' "$1" "$(basename "$1")"
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
    # --no-rebuild: item build built every target; two halves of one
    # configuration may run at once, and two ninjas must not share a directory
    if ! meson test -C "$rt_dir" --no-rebuild --print-errorlogs --num-processes "$rt_procs" \
        --timeout-multiplier "$rt_mult" --logbase "$rt_base" "$@" >"$rt_log" 2>&1; then
        grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)' "$rt_log" >&2 || true
        tail -n 60 "$rt_log" >&2
        # each failed test's own output, its last lines: --print-errorlogs
        # puts it where the test failed, which later tests push out of the
        # tail above (a CI log keeps only what this script prints)
        python3 -c '
import json, sys
for line in open(sys.argv[1], errors="replace"):
    t = json.loads(line)
    if t.get("result") in ("FAIL", "TIMEOUT", "ERROR", "UNEXPECTEDPASS"):
        out = (t.get("stdout") or "") + (t.get("stderr") or "")
        print("--- %s (%s), the last lines of its output:" % (t["name"], t["result"]))
        print("\n".join(out.splitlines()[-150:]) or "(none)")' \
            "$rt_dir/meson-logs/$rt_base.json" >&2 || true
        say "$rt_name: tests failed (logs: $rt_log, $rt_dir/meson-logs/$rt_base.txt)"
        return 1
    fi
}

# item KIND NAME DIR [meson options...]: one piece of a configuration's
# work, run by a lane. build: configure and build DIR, every target (the
# synthetic traces the tests read are not in ninja's default), then mark it
# built; tests1, tests2: every other test of those that may run beside
# others (the first half, the second); valgrind: the valgrind suite (gcc
# only); quiet: start the quiet tests side by side in the background (the
# lane goes on; $TMPD/quiet-DIR gets their status and seconds). Each
# appends its seconds to DIR/bootstrap-build or DIR/bootstrap-tests.
item() {
    kind=$1 name=$2 dir=$3
    shift 3
    t0=$(now)
    echo "$name: $kind since $(date +%H:%M:%S)" >"$TMPD/phase-$LANE"
    say "[$name] $kind"
    case $kind in
    build)
        setup "$dir" "$@" || { say "[$name] build failed"; return 1; }
        extra=$(meson introspect --targets "$dir" | python3 -c '
import json, os, sys
d = os.path.realpath(sys.argv[1])
for t in json.load(sys.stdin):
    if not t.get("build_by_default", True):
        for f in t["filename"]:
            print(os.path.relpath(os.path.realpath(f), d))' "$dir") || {
            say "[$name] cannot list its targets"
            return 1
        }
        # shellcheck disable=SC2086 # names have no spaces
        [ -z "$extra" ] || ninja -C "$dir" ${JOBS:+-j "$JOBS"} $extra >/dev/null || {
            say "[$name] build failed"
            return 1
        }
        lists "$dir" || { say "[$name] cannot list its tests"; return 1; }
        echo "$(($(now) - t0))" >>"$dir/bootstrap-build"
        : >"$dir/bootstrap-built"
        say "[$name] build in $(mmss $(($(now) - t0)))"
        return 0
        ;;
    tests1 | tests2)
        # a failed listing must not pass as "no tests" (errexit is off in here)
        # shellcheck disable=SC2015 # either failure takes the same branch
        list=$(cat "$dir/bootstrap-list-parallel") && [ -n "$list" ] || { say "[$name] no tests to run"; return 1; }
        list=$(printf '%s\n' "$list" | awk -v k="${kind#tests}" 'NR % 2 == k % 2')
        # shellcheck disable=SC2086 # names have no spaces
        run_tests "$name" "$dir" "$PROCS" 3 "$dir/bootstrap-$kind.log" $list || return 1
        ;;
    valgrind)
        run_tests "valgrind" "$dir" 1 3 "$dir/bootstrap-valgrind.log" --suite valgrind || return 1
        ;;
    quiet)
        list=$(cat "$dir/bootstrap-list-quiet") || return 1
        if [ -z "$list" ]; then # none in this configuration (the `once` suite's)
            echo "0 0" >"$TMPD/quiet-$(basename "$dir")"
            return 0
        fi
        (
            rc=0
            pids=
            for t in $list; do
                run_tests "$name" "$dir" 1 2 "$dir/bootstrap-quiet-$t.log" "$t" &
                pids="$pids $!"
            done
            for p in $pids; do wait "$p" || rc=1; done
            q=$TMPD/quiet-$(basename "$dir")
            echo "$rc $(($(now) - t0))" >"$q.tmp" && mv "$q.tmp" "$q"
        ) &
        return 0
        ;;
    esac
    echo "$(($(now) - t0))" >>"$dir/bootstrap-tests"
    say "[$name] $kind in $(mmss $(($(now) - t0)))"
}

# take: the next piece of work ("KIND|NAME|DIR|CC|OPTS") whose configuration
# is built (a build always is), in the queue's order; "wait" when the queue
# holds only tests of configurations still building; "" when it is empty or
# a lane has failed. Under a lock (mkdir is atomic).
take() {
    until mkdir "$TMPD/lock" 2>/dev/null; do sleep 0.1; done
    c=
    if [ ! -f "$TMPD/failed" ] && [ -s "$TMPD/queue" ]; then
        c='wait'
        # the first line that may run now (0: none)
        built=
        for f in */bootstrap-built; do
            [ -f "$f" ] && built="$built ${f%/bootstrap-built}"
        done
        n=$(awk -F'|' -v built="$built " '$1 == "build" || index(built, " " $3 " ") { print NR; exit }' "$TMPD/queue")
        n=${n:-0}
        if [ "$n" -gt 0 ]; then
            c=$(sed -n "${n}p" "$TMPD/queue")
            sed -i "${n}d" "$TMPD/queue"
        fi
    fi
    rmdir "$TMPD/lock"
    printf '%s' "$c"
}

# lane LABEL: work from the queue, one piece after another, until it is empty
lane() {
    label=$1
    LANE=$label
    while c=$(take) && [ -n "$c" ]; do
        if [ "$c" = wait ]; then
            sleep 0.2
            continue
        fi
        IFS='|' read -r kind name dir cc opts <<EOF
$c
EOF
        # shellcheck disable=SC2086
        CC=$cc item "$kind" "$name" "$dir" $opts || {
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
    for c in "$GCC" "$CLANG" "$RELEASE" "$ASAN" "$TSAN"; do
        d=$(echo "$c" | cut -d'|' -f2)
        rm -f "$d/bootstrap-built" "$d/bootstrap-build" "$d/bootstrap-tests" "$d/bootstrap-alone" \
            "$d/bootstrap-quiet" "$d"/bootstrap-list-*
    done
    # the queue, in the order the lanes take it (a piece whose build is not
    # done is passed over): the longest configurations first (build + tests,
    # clean clone on 2 cores: TSan, ASan about twice the others), each one's
    # quiet tests and halves right after its build, the shortest pieces
    # last (valgrind: 1 min), so that neither lane waits long for the other
    # at the end
    {
        for c in "$TSAN" "$ASAN"; do echo "build|$c"; done
        for c in "$TSAN" "$ASAN"; do echo "quiet|$c"; done
        for c in "$TSAN" "$ASAN"; do echo "tests1|$c"; done
        for c in "$TSAN" "$ASAN"; do echo "tests2|$c"; done
        for c in "$GCC" "$CLANG"; do echo "build|$c"; done
        for c in "$GCC" "$CLANG"; do echo "quiet|$c"; done
        echo "tests1|$GCC"
        echo "tests1|$CLANG"
        echo "build|$RELEASE"
        echo "quiet|$RELEASE"
        echo "tests2|$CLANG"
        echo "tests2|$GCC"
        echo "tests1|$RELEASE"
        echo "tests2|$RELEASE"
        echo "valgrind|$GCC"
    } >"$TMPD/queue"
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
    lanes=$(($(now) - start))
    # the quiet tests started beside the lanes: done before anything runs alone
    for c in "$GCC" "$CLANG" "$RELEASE" "$ASAN" "$TSAN"; do
        IFS='|' read -r name dir cc opts <<EOF
$c
EOF
        q=$TMPD/quiet-$(basename "$dir")
        until [ -f "$q" ]; do sleep 0.2; done
        read -r rc secs <"$q"
        [ "$rc" = 0 ] || {
            say "failed after $(mmss $(($(now) - start)))"
            exit 1
        }
        echo "$secs" >"$dir/bootstrap-quiet"
    done
    # the tests that must run alone, one configuration at a time, all cores
    for c in "$GCC" "$CLANG" "$RELEASE" "$ASAN" "$TSAN"; do
        IFS='|' read -r name dir cc opts <<EOF
$c
EOF
        t0=$(now)
        list=$(cat "$dir/bootstrap-list-alone") || exit 1
        # shellcheck disable=SC2086
        run_tests "$name" "$dir" 1 2 "$dir/bootstrap-alone.log" $list || {
            say "failed after $(mmss $(($(now) - start)))"
            exit 1
        }
        echo "$(($(now) - t0))" >"$dir/bootstrap-alone"
        say "[$name] tests that run alone: $(mmss $(($(now) - t0)))"
    done
    say "all configurations passed in $(mmss $(($(now) - start))) on $ncpu cores" \
        "(the lanes $(mmss "$lanes"), then the tests that run alone):"
    for c in "$GCC" "$CLANG" "$RELEASE" "$ASAN" "$TSAN"; do
        IFS='|' read -r name dir cc opts <<EOF
$c
EOF
        b=$(awk '{ s += $1 } END { print s + 0 }' "$dir/bootstrap-build")
        t=$(awk '{ s += $1 } END { print s + 0 }' "$dir/bootstrap-tests")
        a=$(cat "$dir/bootstrap-alone")
        q=$(cat "$dir/bootstrap-quiet")
        quiet=
        [ "$q" = 0 ] || quiet=" ($(mmss "$q") of quiet tests beside the lanes)"
        say "  $(printf '%-18s' "$name") build $(mmss "$b"), tests $(mmss "$t") + $(mmss "$a") alone$quiet"
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
