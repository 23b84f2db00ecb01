#!/bin/bash
# tests/policy-tool.sh: the woffload-policy command line: exit statuses
# (0 valid, warnings allowed; 2 on any error), --var, show, explain.
# usage: policy-tool.sh WOFFLOAD-POLICY SOURCE_ROOT
set -u
tool=$1
root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

expect() { # expect STATUS DESCRIPTION -- command...
    local want=$1 what=$2
    shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ $rc -ne "$want" ]; then
        echo "FAIL $what: exit $rc, expected $want"
        sed 's/^/    /' "$tmp/out" "$tmp/err"
        fail=1
    else
        echo "ok   $what"
    fi
}
contains() { # contains FILE TEXT DESCRIPTION
    if ! grep -qF -- "$2" "$1"; then
        echo "FAIL $3: no '$2' in"
        sed 's/^/    /' "$1"
        fail=1
    fi
}

expect 0 "--help" -- "$tool" --help
contains "$tmp/out" "explain FILE NAME[:SIZE]" "--help"
expect 2 "no arguments" -- "$tool"
expect 2 "unknown command" -- "$tool" frobnicate x.yaml
expect 2 "check without a file" -- "$tool" check
expect 2 "missing file" -- "$tool" check "$tmp/none.yaml"
contains "$tmp/err" "$tmp/none.yaml: error: cannot open the policy: No such file or directory" "missing file"
expect 2 "directory" -- "$tool" check "$tmp"
contains "$tmp/err" "found a directory" "directory"

expect 0 "several valid files" -- "$tool" check "$root"/examples/*.yaml
expect 0 "warnings alone exit 0" -- "$tool" check "$root/tests/policy/good/shadowed-warning.yaml"
contains "$tmp/err" "shadowed-warning.yaml:5:5: warning: rule 2 can never match" "warnings"
expect 2 "one bad file among good ones" -- "$tool" check "$root/examples/empty.yaml" "$root/tests/policy/bad/unknown-key.yaml"
contains "$tmp/err" "unknown-key.yaml:4:5: error: found unknown key 'plce'" "bad among good"

printf 'host_budget: ${BUDGET}\nrules:\n  - match: layers.${RANK}\n    place: host\n' >"$tmp/vars.yaml"
env -u BUDGET "$tool" check "$tmp/vars.yaml" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || { echo "FAIL unset variable: expected exit 2"; fail=1; }
contains "$tmp/err" "vars.yaml:1:14: error: variable 'BUDGET' is not set" "unset variable"
expect 0 "--var before the command" -- "$tool" --var BUDGET=3GiB --var RANK=5 show "$tmp/vars.yaml"
contains "$tmp/out" "host_budget: 3221225472" "--var"
contains "$tmp/out" 'match: ["layers.5"]' "--var RANK"
expect 0 "--var after the command overrides the environment" -- env BUDGET=1GiB "$tool" show --var BUDGET=2GiB "$tmp/vars.yaml"
contains "$tmp/out" "host_budget: 2147483648" "--var overrides"
expect 0 "environment" -- env BUDGET=1GiB RANK=2 "$tool" show "$tmp/vars.yaml"
contains "$tmp/out" "host_budget: 1073741824" "environment"
# llama.cpp's GGUF names against the examples that mirror its flags (docs/policy.md)
ex="$root/examples"
expect 0 "explain -ot exps=CPU" -- "$tool" explain "$ex/llamacpp-ot-exps-cpu.yaml" blk.3.ffn_up_exps.weight token_embd.weight
contains "$tmp/out" "=> host, by rule 1 'exps' (llamacpp-ot-exps-cpu.yaml:15)" "explain -ot exps=CPU: experts"
contains "$tmp/out" "=> device, by the default" "explain -ot exps=CPU: embeddings"
for n in blk.0.ffn_gate_exps.weight blk.7.ffn_down_exps.weight blk.8.ffn_up_exps.weight blk.17.ffn_up_exps.weight blk.3.attn_q.weight; do
    "$tool" explain "$ex/llamacpp-n-cpu-moe.yaml" "$n" >"$tmp/out" 2>&1
    case $n in blk.[0-7].ffn_*) want="=> host, by rule 1 'experts-of-layers-0-7'" ;; *) want="=> device, by the default" ;; esac
    contains "$tmp/out" "$want" "explain --n-cpu-moe 8: $n"
done
expect 0 "explain fit with GGUF names" -- "$tool" explain "$ex/llamacpp-fit.yaml" blk.3.ffn_up_exps.weight model.embed_tokens.weight output.weight blk.0.attn_norm.weight blk.0.attn_q.weight
contains "$tmp/out" "fit: class 4 of 0-5 (routed experts)" "explain fit: experts"
contains "$tmp/out" "fit: class 5 of 0-5 (token embeddings)" "explain fit: embeddings"
contains "$tmp/out" "fit: class 3 of 0-5 (the output head)" "explain fit: output.weight"
contains "$tmp/out" "fit: class 0 of 0-5 (norms, biases, routers)" "explain fit: norms"
contains "$tmp/out" "fit: class 1 of 0-5 (attention)" "explain fit: attention"
# llama.cpp's token_embd.weight in GPU memory is a tied output head (its input
# layer stays in a CPU buffer): a head, not an embedding
expect 0 "explain fit: token_embd" -- "$tool" explain "$ex/llamacpp-fit.yaml" token_embd.weight
contains "$tmp/out" "fit: class 3 of 0-5 (the output head)" "explain fit: token_embd.weight"
expect 2 "bad --var" -- "$tool" --var NOEQUALS show "$tmp/vars.yaml"

expect 0 "show" -- "$tool" show "$root/examples/moe-experts-host.yaml"
grep -v '^#' "$tmp/out" >"$tmp/norm1.yaml"
expect 0 "show of show" -- "$tool" show "$tmp/norm1.yaml"
grep -v '^#' "$tmp/out" | sed 's/ *# rule.*//' >"$tmp/norm2.yaml"
sed 's/ *# rule.*//' "$tmp/norm1.yaml" | cmp -s - "$tmp/norm2.yaml" || { echo "FAIL show is not a fixed point"; fail=1; }
expect 2 "show of a bad file" -- "$tool" show "$root/tests/policy/bad/min-over-max.yaml"

expect 0 "explain" -- "$tool" explain "$root/examples/dense-host-budget.yaml" \
    model.layers.0.mlp.up_proj.weight:100MiB model.norm.weight:8KiB model.embed_tokens.weight
contains "$tmp/out" "rule 1 'keep-embeddings' (dense-host-budget.yaml:11): no: match: no run of whole name components equals 'embed_tokens', 'lm_head', 'wte'" "explain why not"
contains "$tmp/out" "=> host, by rule 2 'weights'" "explain result"
contains "$tmp/out" "min_size: 8.00 KiB is below 4.00 MiB" "explain size"
contains "$tmp/out" "=> device, by rule 1 'keep-embeddings'" "explain first match"
printf 'model.layers.0.mlp.up_proj.weight:100MiB\n# a comment\n\nmodel.norm.weight:8KiB\n' >"$tmp/names"
"$tool" explain "$root/examples/dense-host-budget.yaml" - <"$tmp/names" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] || { echo "FAIL explain -: exit status"; fail=1; }
[ "$(grep -c '^  => ' "$tmp/out")" = 2 ] || { echo "FAIL explain -: expected 2 results"; cat "$tmp/out"; fail=1; }
contains "$tmp/out" "model.norm.weight (8.00 KiB)" "explain - reads stdin"
expect 2 "explain with a bad size" -- "$tool" explain "$root/examples/empty.yaml" x.weight:12XB
expect 2 "explain without names" -- "$tool" explain "$root/examples/empty.yaml"
# place: cpu / CPU is host (llama.cpp's -ot ...=CPU)
expect 0 "explain with place: CPU" -- "$tool" explain "$root/tests/policy/good/cpu-synonym.yaml" \
    model.layers.0.mlp.experts.w1
contains "$tmp/out" "=> host, by rule 1 'experts'" "place: CPU is host"
expect 0 "explain with place: cpu" -- "$tool" explain "$root/tests/policy/good/cpu-synonym.yaml" \
    model.norm.weight
contains "$tmp/out" "=> host, by rule 2 'norms'" "place: cpu is host"
# The whole policies in docs/policy.md (```yaml blocks with a rules: line) are valid.
awk -v dir="$tmp" '/^```yaml/{f=1; n++; next} /^```/{f=0} f{print > (dir "/doc-" n ".yaml")}' \
    "$root/docs/policy.md"
ndoc=0
for f in "$tmp"/doc-*.yaml; do
    grep -q '^rules:' "$f" || continue
    ndoc=$((ndoc + 1))
    expect 0 "docs/policy.md block $(basename "$f")" -- "$tool" check "$f"
done
[ $ndoc -ge 2 ] || { echo "FAIL found only $ndoc policies in docs/policy.md"; fail=1; }
exit $fail
