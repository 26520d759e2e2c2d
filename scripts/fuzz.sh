#!/usr/bin/env bash
# Build the libFuzzer targets with clang (ASan + UBSan) and run each for FUZZ_SECONDS, starting
# from the seed corpus in tests/fuzz/corpus/<target>. New corpus entries go to a scratch
# directory under the build dir; crashes are written there too (and the run fails).
#
#   FUZZ_SECONDS=600 scripts/fuzz.sh            # all targets, 10 minutes each
#   FUZZ_SECONDS=60 scripts/fuzz.sh tree_parents
# Environment: BUILD_DIR (default build-fuzz), FUZZ_SECONDS (default 60), JOBS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
BUILD_DIR="${BUILD_DIR:-build-fuzz}"
seconds="${FUZZ_SECONDS:-60}"
command -v clang++ >/dev/null || { echo "[specula] clang++ not found (Debian: clang)" >&2; exit 1; }
cmake -S . -B "$BUILD_DIR" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSPECULA_ENABLE_CUDA=OFF -DSPECULA_BUILD_BENCH=OFF -DSPECULA_BUILD_EXAMPLES=OFF \
  -DSPECULA_BUILD_FUZZERS=ON >/dev/null
targets=("$@")
((${#targets[@]})) || targets=(validate_rows tree_parents decode_faults)
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]/#/specula_fuzz_}"
for t in "${targets[@]}"; do
  work="$BUILD_DIR/fuzz-work/$t"
  mkdir -p "$work/corpus"
  echo "[specula] fuzzing $t for ${seconds}s"
  "$BUILD_DIR/tests/fuzz/specula_fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$work/" -rss_limit_mb=4096 "$work/corpus" "tests/fuzz/corpus/$t" \
    2>"$work/log.txt" || { tail -40 "$work/log.txt"; exit 1; }
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^Done' "$work/log.txt" || true
done
