#!/bin/sh
# tests/test-docs.sh SOURCE_DIR: the user documents stay short and readable
# by someone outside the project: README.md at most 900 words; README.md,
# docs/performance.md and docs/install.md free of internal shorthand (issue
# numbers, commit hashes, "lent" machines, run labels such as r7), result
# file names aside; the policies in README.md's yaml blocks are valid
# (woffload-policy check, when given as a second argument).
set -u
src=$1
policy=${2:-}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

words=$(wc -w <"$src/README.md")
if [ "$words" -gt 900 ]; then
    fail "README.md has $words words, more than 900: move detail to docs/"
else
    echo "ok   README.md: $words words"
fi

for f in README.md docs/performance.md docs/install.md; do
    [ -f "$src/$f" ] || { fail "$f is missing"; continue; }
    # result files keep their recorded names; everything else is checked:
    # "issue 18", "lent", "r7"/"r7h", 7-40 hex digits with a digit and a letter
    sed -E 's#[A-Za-z0-9_./-]*(e2e|serve-rows|bigload|tp2|gpu-suite|calibrate|peer|picks-stray)-[0-9][A-Za-z0-9_.-]*/?##g' "$src/$f" |
        grep -n -i -E '(^|[^A-Za-z])issues? ?#?[0-9]|(^|[^A-Za-z])lent([^A-Za-z]|$)|(^|[^A-Za-z0-9])r[0-9]+h?([^A-Za-z0-9]|$)|(^|[^0-9A-Za-z])[0-9a-f]{7,40}([^0-9A-Za-z]|$)' |
        awk '{ line = $0; hit = 0
               if (line ~ /[Ii]ssues? ?#?[0-9]|[^A-Za-z][Ll]ent([^A-Za-z]|$)|[^A-Za-z0-9]r[0-9]+h?([^A-Za-z0-9]|$)/) hit = 1
               n = split(line, w, /[^0-9A-Za-z]+/)
               for (i = 1; i <= n; i++)
                   if (w[i] ~ /^[0-9a-f]+$/ && length(w[i]) >= 7 && w[i] ~ /[a-f]/ && w[i] ~ /[0-9]/) hit = 1
               if (hit) print }' | sed "s#^#    $f:#" >"/tmp/wo-docs-$$.hits"
    if [ -s "/tmp/wo-docs-$$.hits" ]; then
        fail "$f has internal shorthand:"
        cat "/tmp/wo-docs-$$.hits"
    else
        echo "ok   $f: no internal shorthand"
    fi
    rm -f "/tmp/wo-docs-$$.hits"
done

if [ -n "$policy" ]; then
    tmp=$(mktemp -d /tmp/wo-docs-XXXXXX)
    awk -v dir="$tmp" '/^```yaml/{f=1; n++; next} /^```/{f=0} f{print > (dir "/readme-" n ".yaml")}' "$src/README.md"
    for y in "$tmp"/readme-*.yaml; do
        [ -f "$y" ] || continue
        if "$policy" check "$y" >/dev/null 2>"$tmp/err"; then
            echo "ok   README.md's policy block ${y##*/}"
        else
            fail "README.md's policy block ${y##*/} is not valid:"
            sed 's/^/    /' "$tmp/err"
        fi
    done
    rm -rf "$tmp"
fi
[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
