#!/bin/sh
# tests/test-install.sh BUILD_DIR SOURCE_DIR FAKE_DIR CC [SANITIZER_RUNTIME]:
# libwoffload as an installed library. `meson install --destdir` into a
# temporary tree; there, pkg-config finds woffload.pc (PKG_CONFIG_PATH and
# PKG_CONFIG_SYSROOT_DIR pointing into the tree) and its flags name the
# installed include/woffload.h and -lwoffload; examples/c-engine.c (tag
# scope, window, woffload_tag, seal, stats) builds with those flags alone and
# runs on the fake driver with a host policy: the library it loads is the
# installed one, every call gives what woffload.h documents, the experts are
# placed in host memory and the engine's bytes round-trip.
set -u
build=$1
src=$2
fake=$3
cc=$4
san=${5:-}
tmp=$(mktemp -d /tmp/wo-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

dest=$tmp/dest
if ! meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/install.log" 2>&1; then
    echo "FAIL: meson install --destdir failed:"
    sed 's/^/    /' "$tmp/install.log" | tail -20
    exit 1
fi
pc=$(find "$dest" -name woffload.pc | head -n 1)
hdr=$(find "$dest" -path '*/include/woffload.h' | head -n 1)
lib=$(find "$dest" -name libwoffload.so | head -n 1)
[ -n "$pc" ] || { echo "FAIL: no woffload.pc installed"; find "$dest" | sed 's/^/    /' | head -40; exit 1; }
[ -n "$hdr" ] || fail "include/woffload.h not installed"
[ -n "$lib" ] || fail "libwoffload.so not installed"
echo "ok   installed: ${pc#"$dest"}, ${hdr#"$dest"}, ${lib#"$dest"}"

export PKG_CONFIG_PATH="${pc%/*}" PKG_CONFIG_SYSROOT_DIR="$dest"
flags=$(pkg-config --cflags --libs woffload) || { echo "FAIL: pkg-config --cflags --libs woffload"; exit 1; }
version=$(pkg-config --modversion woffload)
echo "ok   pkg-config woffload $version: $flags"
case " $flags " in *" -lwoffload "*) ;; *) fail "the flags lack -lwoffload" ;; esac
case " $flags " in *" -I$dest/"*) ;; *) fail "the include flag does not point into the installed tree" ;; esac
case " $flags " in *" -L$dest/"*) ;; *) fail "the library flag does not point into the installed tree" ;; esac

# shellcheck disable=SC2086
if ! $cc -std=c11 -Wall -Wextra -Werror "$src/examples/c-engine.c" $flags -ldl -o "$tmp/c-engine" \
        >"$tmp/cc.log" 2>&1; then
    echo "FAIL: examples/c-engine.c does not build against the installed tree:"
    sed 's/^/    /' "$tmp/cc.log"
    exit 1
fi
readelf -d "$tmp/c-engine" | grep -q 'NEEDED.*\[libwoffload\.so\]' ||
    fail "c-engine does not link libwoffload.so (NEEDED)"

printf 'version: 1\nrules:\n  - {name: experts, match: [experts], place: host}\n' >"$tmp/policy.yaml"
libdir=${lib%/*}
out=$(env LD_LIBRARY_PATH="$libdir:$fake" LD_PRELOAD="$san" WOFFLOAD_POLICY="$tmp/policy.yaml" \
    timeout 60 "$tmp/c-engine" 2>&1)
st=$?
[ "$st" = 0 ] || fail "c-engine exited $st"
printf '%s\n' "$out" | grep -q "^libwoffload $version\$" || fail "c-engine does not print version $version"
printf '%s\n' "$out" | grep -q '^c-engine: ok$' || fail "c-engine did not finish ok"
stats=$(printf '%s\n' "$out" | sed -n 's/^stats: //p')
printf '%s\n' "$stats" | grep -q '"name":"model.layers.0.mlp.experts.gate_up_proj"[^}]*"placement":"host"' ||
    fail "the experts are not placed in host memory"
printf '%s\n' "$stats" | grep -q '"sealed":true' || fail "the stats do not say sealed"
# the library the engine ran with is the installed one, not the build tree's
maps=$(env LD_LIBRARY_PATH="$libdir:$fake" LD_PRELOAD="$san" LD_TRACE_LOADED_OBJECTS=1 "$tmp/c-engine" 2>&1)
printf '%s\n' "$maps" | grep -q "libwoffload\.so => $libdir/libwoffload\.so" ||
    fail "c-engine does not load the installed library: $maps"
# an installed tool uses the installed paths, even with the build tree there
tool=$(find "$dest" -path '*/bin/woffload' | head -n 1)
if [ -z "$tool" ]; then
    fail "bin/woffload not installed"
else
    doc=$(env LD_LIBRARY_PATH="$fake" "$tool" doctor 2>&1)
    printf '%s\n' "$doc" | grep '^libwoffload:' | grep -q -F "$build" &&
        fail "the installed woffload doctor reports the build tree's library: $(printf '%s\n' "$doc" | grep '^libwoffload:')"
    printf '%s\n' "$doc" | grep -q '^libwoffload:' || fail "the installed woffload doctor has no libwoffload line: $doc"
fi
if [ "$fails" != 0 ]; then
    printf '%s\n' "$out" | sed 's/^/    /' | head -40
    exit 1
fi
echo "ok   examples/c-engine.c built with pkg-config woffload and run on the fake driver"
