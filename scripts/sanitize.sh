#!/usr/bin/env bash
# Host tests under AddressSanitizer + UndefinedBehaviorSanitizer, then a short libFuzzer smoke
# run of every fuzz target (clang), in one command.
#
#   scripts/sanitize.sh [ctest args...]
#   SANITIZE_TARGETS=specula_test_decode FUZZ_TARGETS=decode_faults FUZZ_SECONDS=60 \
#     scripts/sanitize.sh -L faults      # the decoding loops' fault tests and fuzzer only
# Environment: BUILD_DIR (default build-asan), FUZZ_BUILD_DIR (default build-fuzz),
#              FUZZ_SECONDS (default 10 per target), JOBS, SANITIZE_TARGETS (build only these
#              targets; default: all), FUZZ_TARGETS (fuzz only these; default: all).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$SPECULA_ROOT"
ensure_deps

BUILD_DIR="${BUILD_DIR:-build-asan}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
log "ASan+UBSan build ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECULA_ENABLE_CUDA=OFF \
  -DSPECULA_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags"
read -r -a targets <<<"${SANITIZE_TARGETS:-all}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
log "tests under ASan+UBSan (package consumers and docs/lint checks excluded)"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -LE 'package|docs|lint' "$@"

if command -v clang++ >/dev/null 2>&1; then
  FUZZ_BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
  log "libFuzzer smoke runs ($FUZZ_BUILD_DIR, ${FUZZ_SECONDS:-10} s per target)"
  read -r -a fuzz_targets <<<"${FUZZ_TARGETS:-}"
  FUZZ_SECONDS="${FUZZ_SECONDS:-10}" BUILD_DIR="$FUZZ_BUILD_DIR" scripts/fuzz.sh "${fuzz_targets[@]}"
else
  log "clang++ not found: fuzz smoke runs skipped"
fi
