#!/bin/sh
# tests/test-bootstrap-status.sh SOURCE_DIR: `./bootstrap.sh test` exits 0
# when every configuration passes and 1 when one fails. It runs a copy of
# bootstrap.sh in a scratch directory with stand-ins for meson, ninja and
# dpkg-query on PATH (one test per configuration, passing or failing as
# FAKE_FAIL says), so the real builds are neither run nor touched. A passing
# run once exited 1: the EXIT trap's kill of the finished heartbeat failed
# under set -e.
set -u
src=$1
tmp=$(mktemp -d /tmp/wo-bootstrap-status-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

mkdir -p "$tmp/bin" "$tmp/tree" "$tmp/cuda/include"
: >"$tmp/cuda/include/cuda.h"
cp "$src/bootstrap.sh" "$tmp/tree/"
cat >"$tmp/bin/meson" <<'FAKE'
#!/bin/sh
# stand-in for meson: setup makes the directory, introspect lists one
# parallel and one run-alone test, test fails where FAKE_FAIL names the dir
case "$1" in
setup) mkdir -p "$2" && : >"$2/build.ninja" ;;
configure) ;;
introspect)
    case "$2" in
    --targets) echo '[]' ;;
    *)
        echo '[{"name": "p", "suite": ["x:unit"], "is_parallel": true},' \
            '{"name": "a", "suite": ["x:unit"], "is_parallel": false},' \
            '{"name": "q", "suite": ["x:quiet"], "is_parallel": false}]'
        ;;
    esac
    ;;
test)
    shift
    while [ $# -gt 0 ]; do
        [ "$1" = -C ] && dir=$2
        shift
    done
    case " ${FAKE_FAIL:-} " in *" ${dir##*/} "*) echo "1/1 p FAIL"; exit 1 ;; esac
    ;;
esac
exit 0
FAKE
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/ninja"
printf '#!/bin/sh\nprintf "install ok installed"\n' >"$tmp/bin/dpkg-query"
chmod +x "$tmp/bin/meson" "$tmp/bin/ninja" "$tmp/bin/dpkg-query" "$tmp/tree/bootstrap.sh"

run() {
    PATH="$tmp/bin:$PATH" CUDA_HOME="$tmp/cuda" FAKE_FAIL=$1 \
        "$tmp/tree/bootstrap.sh" test >"$tmp/out" 2>&1
}

run ""
rc=$?
if [ "$rc" -ne 0 ]; then
    fail "a passing ./bootstrap.sh test exits $rc, expected 0"
    sed 's/^/    /' "$tmp/out" | tail -20
else
    echo "ok   a passing ./bootstrap.sh test exits 0"
fi
grep -q "all configurations passed" "$tmp/out" || fail "a passing run does not say so"
# the two lanes take the five configurations' builds and test halves from
# one queue: each runs once
for name in "gcc -Werror" "clang -Werror" "release (NDEBUG)" "ASan+UBSan" "TSan"; do
    for piece in build tests1 tests2; do
        n=$(grep -cF "bootstrap: [$name] $piece" "$tmp/out")
        [ "$n" -eq 2 ] || fail "configuration $name: $piece started and ended $n times, expected once each"
    done
done
n=$(grep -cF "bootstrap: [gcc -Werror] valgrind in" "$tmp/out")
[ "$n" -eq 1 ] || fail "valgrind ran $n times, expected once"

for d in build-ci-asan build-ci-tsan; do
    run "$d"
    rc=$?
    if [ "$rc" -ne 1 ]; then
        fail "./bootstrap.sh test with $d failing exits $rc, expected 1"
        sed 's/^/    /' "$tmp/out" | tail -20
    else
        echo "ok   ./bootstrap.sh test with $d failing exits 1"
    fi
    grep -q "failed after" "$tmp/out" || fail "a failing run ($d) does not say it failed"
done
[ "$fails" -eq 0 ] || exit 1
