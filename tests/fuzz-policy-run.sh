#!/bin/sh
# tests/fuzz-policy-run.sh [SECONDS (60)] [BUILD_DIR]: a bounded fuzz run of
# the policy parser, for CI (tests/fuzz-run.sh).
#
# AFL++ instead: build tests/fuzz-policy-replay with CC=afl-clang-fast and run
#   afl-fuzz -i tests/corpus/policy -o OUT -- BUILD/tests/fuzz-policy-replay
# (it reads the input from stdin when given no arguments).
exec "$(dirname "$0")/fuzz-run.sh" policy "$@"
