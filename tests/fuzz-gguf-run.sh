#!/bin/sh
# tests/fuzz-gguf-run.sh [SECONDS (60)] [BUILD_DIR]: a bounded fuzz run of
# the GGUF header reader (tools/gguf.c), for CI (tests/fuzz-run.sh).
exec "$(dirname "$0")/fuzz-run.sh" gguf "$@"
