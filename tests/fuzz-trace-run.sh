#!/bin/sh
# tests/fuzz-trace-run.sh [SECONDS (60)] [BUILD_DIR]: a bounded fuzz run of
# the trace reader, for CI (tests/fuzz-run.sh).
exec "$(dirname "$0")/fuzz-run.sh" trace "$@"
