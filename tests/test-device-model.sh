#!/bin/sh
# tests/test-device-model.sh: the shim's prefetcher reads WOFFLOAD_DEVICE_MODEL
# (uvm/devmodel.c, the file woffload-calibrate writes). A calibrated model is
# taken without a word; a bad one is reported once with its file:line and
# what was wrong, and the run goes on with the built-in figures.
#
# usage: test-device-model.sh TEST_PREFETCH_SHIM FAKE_LIBCUDA GOOD_MODEL BAD_MODEL
set -u
prog=$1 fake=$2 good=$3 bad=$4
fails=0
out=$(WOFFLOAD_DEVICE_MODEL=$good "$prog" "$fake" 2>&1) || { echo "FAIL: the run with $good exited $?"; fails=1; }
if printf '%s\n' "$out" | grep -q 'WOFFLOAD_DEVICE_MODEL'; then
    echo "FAIL: a calibrated model was reported:"
    printf '%s\n' "$out" | grep 'WOFFLOAD_DEVICE_MODEL'
    fails=1
else
    echo "ok: $good taken without a warning"
fi
out=$(WOFFLOAD_DEVICE_MODEL=$bad "$prog" "$fake" 2>&1) || { echo "FAIL: the run with $bad exited $?"; fails=1; }
line=$(printf '%s\n' "$out" | grep 'WOFFLOAD_DEVICE_MODEL' | head -1)
case $line in
*"$bad:3"*zc_gbz*built-in*) echo "ok: $line" ;;
*) echo "FAIL: expected one warning naming $bad:3, the key and the fallback; got:"; printf '%s\n' "$out" | head -20; fails=1 ;;
esac
exit $fails
