#!/bin/sh
# tests/fake/probe-parity.sh PROBE EXPECTED: runs probe-driver against the
# fake driver (LD_LIBRARY_PATH set by meson) and compares every answer with
# the ones the real driver gave (probe-real.txt: H100, driver 580.159.04,
# runtime 13.0.96, recorded with `probe-driver > probe-real.txt` on the lent
# GPU). Any difference is a place where the fake no longer behaves like the
# real driver.
set -eu
out=$("$1")
if printf '%s\n' "$out" | diff -u "$2" -; then
    echo "fake answers like the real driver: $(printf '%s\n' "$out" | wc -l) answers"
else
    echo "fake and real driver differ (- real, + fake)" >&2
    exit 1
fi
