#!/bin/sh
# tests/test-exports.sh LIB SYMFILE: the dynamic symbols libwoffload.so
# defines must be exactly the `global:` list of its version script. A symbol
# exported by accident (a missing `static`, a WO_EXPORT on an internal) or a
# listed hook that is not built both fail, with a diff.
#
# The version script is parsed, not pattern-matched: C comments are stripped,
# entries between `global:` and the next `local:` (or the closing brace) are
# taken, and a glob entry (`cu*`) matches any exported name, so it is checked
# against the exports instead of being required to exist.
set -eu

lib=${1:?usage: test-exports.sh LIB SYMFILE}
sym=${2:?usage: test-exports.sh LIB SYMFILE}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -r "$lib" ] || { echo "test-exports: $lib: not readable" >&2; exit 1; }
[ -r "$sym" ] || { echo "test-exports: $sym: not readable" >&2; exit 1; }

# Entries of the global: sections, one per line.
awk '
    # strip /* ... */ comments, also across lines, and // and # comments
    {
        line = $0
        out = ""
        while (length(line) > 0) {
            if (incomment) {
                i = index(line, "*/")
                if (i == 0) { line = ""; break }
                line = substr(line, i + 2)
                incomment = 0
            } else {
                i = index(line, "/*")
                if (i == 0) { out = out line; line = "" }
                else { out = out substr(line, 1, i - 1) " "; line = substr(line, i + 2); incomment = 1 }
            }
        }
        sub(/\/\/.*/, "", out)
        sub(/#.*/, "", out)
        gsub(/[{};]/, " & ", out)
        n = split(out, tok, /[ \t]+/)
        for (k = 1; k <= n; k++) {
            t = tok[k]
            if (t == "") continue
            if (t == "global:") { sect = "g"; continue }
            if (t == "local:") { sect = "l"; continue }
            if (t == "global" || t == "local") { pending = t; continue }
            if (t == ":" && pending != "") { sect = substr(pending, 1, 1); pending = ""; continue }
            if (t == "{" || t == ";") continue
            if (t == "}") { sect = ""; continue }
            if (sect == "g") print t
        }
    }
' "$sym" | sort -u >"$tmp/listed"

if [ ! -s "$tmp/listed" ]; then
    echo "test-exports: no global: entries found in $sym" >&2
    exit 1
fi

# Names the library defines in its dynamic symbol table, without versions.
nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' | sort -u >"$tmp/exported"

# Globs in the list: exports they match count as listed.
grep '[*?[]' "$tmp/listed" >"$tmp/globs" || true
grep -v '[*?[]' "$tmp/listed" >"$tmp/plain" || true
: >"$tmp/globbed"
if [ -s "$tmp/globs" ]; then
    while IFS= read -r name; do
        while IFS= read -r glob; do
            # shellcheck disable=SC2254
            case $name in $glob) echo "$name" >>"$tmp/globbed"; break ;; esac
        done <"$tmp/globs"
    done <"$tmp/exported"
fi
sort -u "$tmp/plain" "$tmp/globbed" >"$tmp/expected"

if ! diff -u "$tmp/expected" "$tmp/exported" >"$tmp/diff"; then
    echo "test-exports: nm -D --defined-only $lib differs from the global: list of $sym" >&2
    echo "  (- listed but not exported, + exported but not listed)" >&2
    sed -n '3,$p' "$tmp/diff" | grep '^[-+]' >&2 || true
    exit 1
fi
echo "test-exports: $(wc -l <"$tmp/exported") exports match $sym"
