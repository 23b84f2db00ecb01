#!/usr/bin/env bash
# bench/llamacpp-kit.sh: make, on this machine, what the GPU machine needs to
# build and run llama.cpp beside the shim. Everything goes in ignored folders
# that a device call carries: carry [".peers", "build-yaml"].
#
#   bash bench/llamacpp-kit.sh [GIT_DIR]
#
# Without GIT_DIR it makes build-yaml only (what any GPU run of the shim
# needs). GIT_DIR: a bare git directory of a llama.cpp snapshot holding commit
# 34af94cd (the unslothai/llama.cpp snapshot does; fetch it with the library's
# fetch tool). It makes:
#   .peers/llama.txz   llama.cpp's tree for llama-server and llama-batched-bench
#                      (../shared/peers/llamacpp/make-tree.sh with SERVER=1), as
#                      one xz archive: about 6 MB against 34 MB unpacked.
#                      bench/llamacpp-device.sh unpacks it on the device.
#   .peers/llamacpp    the peers kit (gen_gguf.py, go.sh, make-tree.sh)
#   build-yaml/root    libyaml and cmocka as unpacked Debian packages
#                      (bench/README.md: the GPU machine has no package registry)
#
# A device call carries at most 64 MiB: the tracked files plus these. The
# script prints the sum and fails when it is over.
set -eu
cd "$(dirname "$0")/.."
G=${1:-}
PEERS=${PEERS_KIT:-../shared/peers/llamacpp}
if [ -n "$G" ]; then
    [ -f "$PEERS/make-tree.sh" ] || { echo "llamacpp-kit: no peers kit at $PEERS (set PEERS_KIT)" >&2; exit 1; }
    mkdir -p .peers
    [ -d .peers/llamacpp ] && chmod -R u+w .peers/llamacpp && rm -rf .peers/llamacpp
    cp -r "$PEERS" .peers/llamacpp && chmod -R u+w .peers/llamacpp
    if [ ! -s .peers/llama.txz ]; then
        tmp=$(mktemp -d)
        # make-tree.sh's git archive names blobs the snapshot lacks (models/*.gguf): its
        # errors about them are expected, the paths it needs are whole
        SERVER=1 bash .peers/llamacpp/make-tree.sh "$G" "$tmp/llama" >/dev/null 2>&1 || true
        [ -f "$tmp/llama/tools/server/server.cpp" ] || { echo "llamacpp-kit: $G did not give the tree (no tools/server/server.cpp)" >&2; exit 1; }
        tar cJf .peers/llama.txz -C "$tmp" llama
        rm -rf "$tmp"
    fi
fi
if [ ! -f build-yaml/root/usr/lib/x86_64-linux-gnu/pkgconfig/yaml-0.1.pc ]; then
    rm -rf build-yaml
    mkdir -p build-yaml
    (cd build-yaml &&
        apt-get download libyaml-0-2 libyaml-dev libcmocka0 libcmocka-dev zlib1g-dev 2>/dev/null &&
        for f in *.deb; do dpkg -x "$f" root; done && rm -f ./*.deb &&
        cd root/usr/lib/x86_64-linux-gnu/pkgconfig &&
        sed -i 's|^prefix=.*|prefix=${pcfiledir}/../../..|' yaml-0.1.pc zlib.pc &&
        sed -i 's|-L/usr/lib/x86_64-linux-gnu|-L${pcfiledir}/..|; s|-I/usr/include|-I${pcfiledir}/../../../include|' cmocka.pc &&
        ln -sf /lib/x86_64-linux-gnu/libz.so.1 ../libz.so && rm -f ../libz.a ../libyaml.a &&
        rm -rf ../../../share/doc ../../../share/man)
fi
# a file's size as an archive holds it: a 512-byte header and its data in
# 512-byte blocks (the device call refused a tree of 62 MiB in plain sizes:
# 3,300 small files cost more than their bytes). One awk over every file:
# `xargs du -c` would print a total for each batch of names, not one.
tarsize() { xargs -0 stat -c %s 2>/dev/null | awk '{s += 512 + int(($1 + 511) / 512) * 512} END {print s + 0}'; }
tracked=$(git ls-files -z | tarsize)
kit=$(find .peers build-yaml -type f -print0 2>/dev/null | tarsize)
total=$((tracked + kit))
echo "llamacpp-kit: tracked $((tracked >> 20)) MiB + kit $((kit >> 20)) MiB = $((total >> 20)) MiB of the 64 MiB a call carries"
[ "$total" -le $((64 << 20)) ] || { echo "llamacpp-kit: over 64 MiB: the device call will refuse it" >&2; exit 1; }
