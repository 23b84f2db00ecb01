#!/bin/sh
# tests/test-linkage.sh LIB [SANITIZER_RUNTIME [LOADER]]: libwoffload.so never links the CUDA driver or
# runtime (they are dlopen()ed on first use, so the library must also work
# in a process that has neither), and it loads and runs its public API in a
# process where no CUDA driver can be found:
#   1. readelf -d: no libcuda / libcudart / libcuda stubs in NEEDED, and no
#      libz (the trace reader inflates .wot.gz with zlib; it is linked into
#      the tools only: the shim writes plain traces and must not bring zlib
#      into an engine's process);
#   2. LOADER (tests/linkage-loader.c: dlopen RTLD_NOW, woffload_version())
#      and python3 ctypes.CDLL(LIB) + woffload_version() (how python/ loads
#      it), with the library path emptied and WOFFLOAD_CUDA_LIB pointing
#      nowhere; libcuda must not be mapped afterwards (loading pulls nothing
#      in);
#   3. LD_PRELOAD=LIB into a plain program, which must exit 0 promptly.
set -eu

lib=${1:?usage: test-linkage.sh LIB [SANITIZER_RUNTIME [LOADER]]}
san=${2:-}
loader=${3:-}
[ -r "$lib" ] || { echo "test-linkage: $lib: not readable" >&2; exit 1; }
lib=$(readlink -f "$lib")
fail=0

dyn=$(readelf -d "$lib") || { echo "test-linkage: readelf -d $lib failed" >&2; exit 1; }
needed=$(printf '%s\n' "$dyn" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
bad=$(printf '%s\n' "$needed" | grep -E '^lib(cuda|cudart|nvidia-|nvcuda)' || true)
if [ -n "$bad" ]; then
    echo "test-linkage: $lib links CUDA libraries it must dlopen instead:" >&2
    printf '  NEEDED %s\n' $bad >&2
    fail=1
fi
if printf '%s\n' "$needed" | grep -q '^libz\.so'; then
    echo "test-linkage: $lib links libz: the trace reader (core/trace-read.c) is in the shim" >&2
    fail=1
fi

# A sanitizer build: its runtime must come first in a process that was not
# built with it. meson passes the runtime it linked (san_runtime); without it,
# runtimes named in NEEDED are found through ldconfig or the compiler. When
# the runtime is linked statically into executables (clang without
# -shared-libsan), the library cannot be loaded elsewhere at all.
preload="$san"
if [ -z "$preload" ]; then
    for rt in $(printf '%s\n' "$needed" | grep -E '^lib((asan|tsan|ubsan|lsan)\.so|clang_rt\.)' || true); do
        path=$(ldconfig -p | awk -v n="$rt" '$1 == n { print $NF; exit }')
        [ -z "$path" ] && path=$( (cc -print-file-name="$rt" 2>/dev/null) || true)
        [ -n "$path" ] && [ -e "$path" ] && preload="$preload${preload:+ }$path"
    done
fi
if [ -z "$preload" ] && nm -D --undefined-only "$lib" | grep -qE ' (__asan_|__tsan_|__ubsan_)'; then
    echo "test-linkage: sanitizer runtime is in the executables of this build; NEEDED checked, load checks skipped"
    exit $fail
fi

empty=$(mktemp -d)
trap 'rmdir "$empty"' EXIT
# leaks of python3 itself are not ours; an instrumented library still
# reports its own errors
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}detect_leaks=0:verify_asan_link_order=0"

status() {
    case $1 in
    124) echo "hung (killed after the timeout)" ;;
    13[0-9] | 1[4-9][0-9] | 2[0-9][0-9]) echo "killed by signal $(($1 - 128))$( [ "$1" = 139 ] && echo ' (SIGSEGV)')" ;;
    *) echo "exit status $1" ;;
    esac
}

# With a sanitizer runtime preloaded, a program may fail without our library
# (TSan cannot run this machine's python3): such a check says nothing about
# the library and is skipped, saying so.
runs_alone() {
    [ -z "$preload" ] || timeout 60 env LD_PRELOAD="$preload" "$@" >/dev/null 2>&1
}

if [ -n "$loader" ]; then
    if out=$(timeout 60 env LD_LIBRARY_PATH="$empty" WOFFLOAD_CUDA_LIB="$empty/libcuda.so.1" \
            LD_PRELOAD="$preload" "$loader" "$lib" 2>&1); then
        echo "test-linkage: loader: $out"
    else
        echo "test-linkage: $loader $lib failed: $(status $?)" >&2
        printf '%s\n' "$out" | sed 's/^/  /' >&2
        fail=1
    fi
fi

if ! runs_alone python3 -c pass; then
    echo "test-linkage: python3 does not run with $preload preloaded even without $lib; ctypes check skipped"
elif out=$(timeout 60 env LD_LIBRARY_PATH="$empty" WOFFLOAD_CUDA_LIB="$empty/libcuda.so.1" \
        LD_PRELOAD="$preload" python3 - "$lib" 2>&1 <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.woffload_version.restype = ctypes.c_char_p
v = lib.woffload_version()
if not v:
    sys.exit("woffload_version() returned NULL")
maps = open("/proc/self/maps").read()
for bad in ("libcuda.so", "libcudart.so"):
    if bad in maps:
        sys.exit("loading pulled in " + bad)
print("loaded, version", v.decode())
PY
); then
    echo "test-linkage: ctypes: $out"
else
    echo "test-linkage: loading $lib with ctypes failed: $(status $?)" >&2
    printf '%s\n' "$out" | sed 's/^/  /' >&2
    fail=1
fi

prog=$(command -v true)
if ! runs_alone "$prog"; then
    echo "test-linkage: $prog does not run with $preload preloaded even without $lib; LD_PRELOAD check skipped"
elif out=$(timeout 30 env LD_LIBRARY_PATH="$empty" WOFFLOAD_CUDA_LIB="$empty/libcuda.so.1" \
        LD_PRELOAD="$preload${preload:+ }$lib" "$prog" 2>&1); then
    echo "test-linkage: LD_PRELOAD into $prog: ok"
else
    echo "test-linkage: LD_PRELOAD=$lib $prog failed: $(status $?)" >&2
    printf '%s\n' "$out" | sed 's/^/  /' >&2
    fail=1
fi
exit $fail
