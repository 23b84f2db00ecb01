# tests/expect-lib.sh: sourced by the shell tests of the tools
# (test-replay-tool.sh, test-fit-tool.sh). Gives a scratch folder $dir
# (removed at exit), fail MESSAGE (counts and prints a failure),
# expect STATUS PATTERN -- CMD... (CMD's exit status and that its stdout and
# stderr, kept in $dir/out, match PATTERN with grep -E) and finish (exit 1
# with the count when anything failed).
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

expect() {
    want=$1
    pat=$2
    shift 3
    "$@" >"$dir/out" 2>&1
    got=$?
    if [ "$got" != "$want" ]; then
        fail "$* exited $got, want $want"
        sed 's/^/    /' "$dir/out"
    elif ! grep -Eq -e "$pat" "$dir/out"; then
        fail "$*: output lacks /$pat/"
        sed 's/^/    /' "$dir/out"
    else
        echo "ok   $*"
    fi
}

finish() {
    if [ "$fails" -ne 0 ]; then
        echo "$fails failure(s)"
        exit 1
    fi
    exit 0
}
