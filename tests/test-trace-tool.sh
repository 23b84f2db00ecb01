#!/bin/sh
# tests/test-trace-tool.sh TOOL GEN CORPUS: woffload-trace's commands and exit
# codes (0 success, 2 usage or input error: a missing, corrupt or truncated
# trace, 1 failure: an output that cannot be written) on a synthetic MoE
# trace from gen-trace, on damaged copies of it and on the committed corpus.
set -u
tool=$1
gen=$2
corpus=$3
tmp=$(mktemp -d /tmp/wo-trace-tool-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE DESCRIPTION -- command...: runs it, output in $tmp/out
expect() {
    want=$1
    what=$2
    shift 3
    "$@" >"$tmp/out" 2>&1
    got=$?
    if [ "$got" -ne "$want" ]; then
        fail "$what: exit $got, expected $want"
        sed 's/^/    /' "$tmp/out" | head -20
    else
        echo "ok   $what (exit $got)"
    fi
}

# grep_out PATTERN DESCRIPTION: the last command's output holds PATTERN
grep_out() {
    if grep -q -- "$1" "$tmp/out"; then
        echo "ok   $2"
    else
        fail "$2: no \"$1\" in:"
        sed 's/^/    /' "$tmp/out" | head -30
    fi
}

t="$tmp/moe.wotrace"
expect 0 "gen-trace writes a trace" -- "$gen" "$t" --layers 4 --experts 8 --topk 2 --steps 8
expect 0 "validate a good trace" -- "$tool" validate "$t"
grep_out "valid: format 1.0" "validate names the format"
grep_out "footer counts match" "validate checks the footer"

expect 0 "summary" -- "$tool" summary "$t"
# 1 embedding + 4 layers x (10 + 4 x top-2) + 3 at the end = 76 launches per step
grep_out "step period: 76 launches" "summary finds the decode step period"
grep_out "synthetic" "summary shows the header"
grep_out "mlp.experts.gate_up_proj" "summary names the experts"
grep_out "names by launches touching them" "summary ranks names by launches"
grep_out "model.layers.\*.mlp.experts.gate_up_proj" "summary folds layer numbers into groups"
expect 0 "summary --top 3" -- "$tool" summary --top 3 "$t"
# another shape: 1 + 2 x (10 + 4 x 1) + 3 = 32 launches per step
expect 0 "gen-trace, a second shape" -- "$gen" "$tmp/b.wotrace" --layers 2 --experts 4 --topk 1 --steps 12 --skew 0
expect 0 "summary of the second shape" -- "$tool" summary "$tmp/b.wotrace"
grep_out "step period: 32 launches" "the period of the second shape"
expect 0 "gen-trace, one step" -- "$gen" "$tmp/one.wotrace" --layers 1 --experts 2 --topk 1 --steps 1
expect 0 "summary of a single step" -- "$tool" summary "$tmp/one.wotrace"
grep_out "step period: none found" "a single step has no period"

expect 0 "export-chrome" -- "$tool" export-chrome "$t" "$tmp/moe.json"
if command -v python3 >/dev/null 2>&1; then
    expect 0 "export-chrome writes valid JSON with every launch" -- python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
launches = [e for e in ev if e.get("cat") == "launch"]
assert len(launches) == 8 * 76, len(launches)
assert all(e["ph"] in ("i", "X", "M", "C") for e in ev)
assert any(e["ph"] == "C" for e in ev), "no allocation counter"
assert any("experts" in str(e.get("args", {})) for e in launches), "no expert names on launches"
' "$tmp/moe.json"
fi

# gzip-compressed: read as it is, the same summary as the plain file; a cut
# .gz names the file and the truncated gzip data
gzip -9c "$t" >"$tmp/moe.wot.gz"
expect 0 "validate a .wot.gz" -- "$tool" validate "$tmp/moe.wot.gz"
"$tool" summary "$t" | tail -n +2 >"$tmp/plain.txt"
"$tool" summary "$tmp/moe.wot.gz" | tail -n +2 >"$tmp/gz.txt"
if [ -s "$tmp/plain.txt" ] && cmp -s "$tmp/plain.txt" "$tmp/gz.txt"; then
    echo "ok   summary of the .wot.gz equals that of the plain trace"
else
    fail "summary of the .wot.gz differs from the plain trace's:"
    diff "$tmp/plain.txt" "$tmp/gz.txt" | head -20
fi
zsize=$(wc -c <"$tmp/moe.wot.gz")
head -c $((zsize / 2)) "$tmp/moe.wot.gz" >"$tmp/cut.wot.gz"
expect 2 "validate a truncated .wot.gz" -- "$tool" validate "$tmp/cut.wot.gz"
grep_out "cut.wot.gz: invalid: offset [0-9]* of the decompressed trace: truncated gzip data" \
    "the truncated .gz is named, with the offset where its data stops"
expect 2 "summary of a truncated .wot.gz" -- "$tool" summary "$tmp/cut.wot.gz"
grep_out "truncated gzip data" "summary names the truncated gzip data"

size=$(wc -c <"$t")
head -c $((size - 5)) "$t" >"$tmp/cut.wotrace"
expect 2 "validate a truncated trace" -- "$tool" validate "$tmp/cut.wotrace"
grep_out "invalid: offset [0-9]*: truncated footer record" "the truncation is named with its offset"
expect 2 "summary of a truncated trace" -- "$tool" summary "$tmp/cut.wotrace"
grep_out "CORRUPT: offset" "summary shows the error and what precedes it"
expect 2 "export-chrome of a truncated trace" -- "$tool" export-chrome "$tmp/cut.wotrace" "$tmp/cut.json"

# one flipped bit in the middle
python3 - "$t" "$tmp/flip.wotrace" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[len(b) // 2] ^= 0x10
open(sys.argv[2], "wb").write(b)
PY
expect 2 "validate a trace with a flipped bit" -- "$tool" validate "$tmp/flip.wotrace"
grep_out "CRC mismatch" "the flip is a CRC mismatch"

printf 'not a trace at all\n' >"$tmp/text"
expect 2 "validate a text file" -- "$tool" validate "$tmp/text"
grep_out "not a libwoffload trace" "a foreign file is named as such"

expect 2 "validate a missing file" -- "$tool" validate "$tmp/nope.wotrace"
grep_out "No such file" "the missing file's error"
expect 2 "no arguments" -- "$tool"
expect 2 "unknown command" -- "$tool" frobnicate "$t"
expect 2 "summary without a file" -- "$tool" summary
expect 1 "export-chrome to an unwritable path" -- "$tool" export-chrome "$t" /nonexistent/x.json
expect 0 "--help" -- "$tool" --help
grep_out "export-chrome" "--help lists the commands"
grep_out "Exit status: 0 success; 2 usage or input error" "--help states the exit codes"

expect 2 "validate a trace without footer" -- "$tool" validate "$corpus/invalid-no-footer.wotrace"
grep_out "without a footer" "the missing footer is named"
expect 0 "validate --allow-partial accepts it" -- "$tool" validate --allow-partial "$corpus/invalid-no-footer.wotrace"
grep_out "no footer" "and says so"

for f in "$corpus"/valid-*; do
    expect 0 "corpus $(basename "$f")" -- "$tool" validate "$f"
done
for f in "$corpus"/invalid-*; do
    expect 2 "corpus $(basename "$f")" -- "$tool" validate "$f"
done

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
