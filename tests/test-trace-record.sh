#!/bin/sh
# tests/test-trace-record.sh CLIENT TOOL: WOFFLOAD_TRACE end to end. The fake
# driver's client-static runs with the shim preloaded (WO_TEST_PRELOAD, the
# fake libcuda.so.1 on LD_LIBRARY_PATH) and records a trace; the trace must
# validate strictly, hold as many launches and graph launches as the client
# made, name its kernels (cuFuncGetName on the consumer thread) and carry the
# driver version. Then an unwritable path and a full disk: one log line each,
# the client still succeeds.
set -u
client=$1
tool=$2
tmp=$(mktemp -d /tmp/wo-trace-record-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }

run_client() { # TRACE_PATH: runs the client under the shim, output in $tmp/client
    LD_PRELOAD="$WO_TEST_PRELOAD" WOFFLOAD_TRACE="$1" "$client" --launches 40 >"$tmp/client" 2>"$tmp/client.err"
}

t="$tmp/run.wotrace"
if run_client "$t"; then ok "the client runs with a trace"; else fail "the client failed"; cat "$tmp/client.err"; fi
if "$tool" validate "$t" >"$tmp/out" 2>&1; then ok "the recorded trace validates"; else fail "validate: $(cat "$tmp/out")"; fi
"$tool" summary "$t" >"$tmp/sum" 2>&1 || fail "summary failed: $(cat "$tmp/sum")"
launches=$(awk '$1 == "count" && ($2 == "launches" || $2 == "launches_ex") { n += $3 } END { print n + 0 }' "$tmp/client")
graphs=$(awk '$1 == "count" && $2 == "graph_launches" { print $3 }' "$tmp/client")
got=$(awk '$1 == "launch" { print $2 }' "$tmp/sum")
gotg=$(awk '$1 == "graph-launch" { print $2 }' "$tmp/sum")
# the client's launch count includes the one recorded into a capture
want=$launches
[ "${got:-0}" -eq "$want" ] && ok "all $want launches recorded" || fail "launches: trace $got, client $want"
[ "${gotg:-0}" -eq "${graphs:-0}" ] && ok "all $graphs graph launches recorded" || fail "graph launches: trace $gotg, client $graphs"
grep -q "cuda_driver_version" "$tmp/sum" && ok "the header has the driver version" || fail "no cuda_driver_version in the header"
# the client waits on its stream (cuStreamSynchronize through cuGetProcAddress)
syncs=$(awk '$1 == "sync" { print $2 }' "$tmp/sum")
[ "${syncs:-0}" -ge 1 ] && ok "$syncs syncs recorded" || fail "no sync event in the trace"
"$tool" export-chrome "$t" "$tmp/run.json" >/dev/null 2>&1 || fail "export-chrome failed"
grep -q '"client_add"' "$tmp/run.json" && ok "kernels are named (cuFuncGetName)" || fail "no kernel name client_add in the export"

for bad in /nonexistent-dir/run.wotrace /dev/full; do
    if run_client "$bad"; then ok "the client succeeds with WOFFLOAD_TRACE=$bad"; else fail "the client failed with $bad"; fi
    n=$(grep -c "trace $bad" "$tmp/client.err")
    [ "$n" -eq 1 ] && ok "one log line for $bad: $(grep "trace $bad" "$tmp/client.err")" ||
        { fail "$n log lines for $bad"; cat "$tmp/client.err"; }
done

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
