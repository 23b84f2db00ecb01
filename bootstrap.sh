#!/bin/sh
# bootstrap.sh: the README's two commands, on a fresh Debian 12 machine with
# the CUDA toolkit (run as root so missing packages can be installed).
#
#   ./bootstrap.sh demo   build, then run the main job
#   ./bootstrap.sh test   build and run the whole test suite: gcc and clang
#                         with -Werror, a release build (NDEBUG), valgrind
#                         on the unit tests,
#                         ASan+UBSan, TSan (what CI runs)
#
# Other verbs: deps (install what is missing), build [DIR] (one debug build).
# CUDA_HOME (default /usr/local/cuda) names the toolkit; only its headers are
# used at build time.
set -eu
cd "$(dirname "$0")"

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PACKAGES="meson ninja-build pkg-config gcc clang libclang-rt-14-dev binutils libyaml-dev zlib1g-dev libcmocka-dev python3 valgrind"

say() { printf 'bootstrap: %s\n' "$*" >&2; }

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

# setup DIR [meson options...]: configure DIR once, reconfigure when options change
setup() {
    dir=$1
    shift
    if [ -f "$dir/build.ninja" ]; then
        meson configure "$dir" "$@" >/dev/null
    else
        meson setup "$dir" -Dcuda-path="$CUDA_HOME" "$@" >/dev/null
    fi
    ninja -C "$dir" >/dev/null || ninja -C "$dir"
}

# check NAME DIR [meson options...]: one configuration of the suite
check() {
    name=$1
    dir=$2
    shift 2
    say "== $name: build"
    setup "$dir" "$@"
    say "== $name: test"
    meson test -C "$dir" --print-errorlogs --num-processes 2 || {
        say "$name: tests failed (logs: $dir/meson-logs/testlog.txt)"
        exit 1
    }
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
    CC=gcc check "gcc -Werror" build-ci-gcc -Dwerror=true
    say "== valgrind memcheck on the unit tests"
    meson test -C build-ci-gcc --suite valgrind --print-errorlogs || {
        say "valgrind: errors (logs: build-ci-gcc/meson-logs/testlog.txt)"
        exit 1
    }
    CC=clang check "clang -Werror" build-ci-clang -Dwerror=true
    CC=gcc check "release (NDEBUG)" build-ci-release -Dbuildtype=release -Db_ndebug=true -Dwerror=true
    CC=gcc check "ASan+UBSan" build-ci-asan -Db_sanitize=address,undefined -Db_lundef=false
    CC=gcc check "TSan" build-ci-tsan -Db_sanitize=thread -Db_lundef=false
    say "all configurations passed"
    ;;
*)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    [ -z "$verb" ] || exit 2
    ;;
esac
