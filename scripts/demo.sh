#!/usr/bin/env bash
# Build and run the verify_chain example.
#
#   scripts/demo.sh [example args...]
#
# Environment: BUILD_DIR (default: build), BUILD_TYPE (default: Release), JOBS.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$SPECULA_ROOT"
ensure_deps

BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
TARGET=specula_example_verify_chain

log "configure ($BUILD_DIR, $BUILD_TYPE)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" >/dev/null
log "build $TARGET"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "$TARGET"

exe="$BUILD_DIR/examples/$TARGET"
[[ -x "$exe" ]] || die "$exe was not built (is examples/verify_chain.cpp present?)"
log "run $exe $*"
exec "$exe" "$@"
