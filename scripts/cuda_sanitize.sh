#!/usr/bin/env bash
# compute-sanitizer over the device test binary: memcheck (out-of-bounds and misaligned
# accesses, leaks), racecheck (shared-memory hazards), synccheck (barrier misuse) and initcheck
# (reads of uninitialised device memory). Needs a GPU; exits 0 with a message without one.
#
#   scripts/cuda_sanitize.sh [Catch2 test spec]     default: every device test except the large
#                                                   statistical ones ([stats]) and the
#                                                   enumeration ([exact]), which only repeat the
#                                                   same kernels many times
# Environment: BUILD_DIR (default: build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
bin="$BUILD_DIR/tests/specula_test_cuda"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
spec="${1:-~[stats]~[exact]}"

if [[ ! -x "$bin" ]]; then
  echo "cuda_sanitize: $bin not built (scripts/test.sh builds it when nvcc is present)" >&2
  exit 1
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "cuda_sanitize: no GPU: skipped"
  exit 0
fi
if [[ ! -x "$sanitizer" ]]; then
  echo "cuda_sanitize: compute-sanitizer not found" >&2
  exit 1
fi

rc=0
for tool in memcheck racecheck synccheck initcheck; do
  extra=()
  [[ $tool == memcheck ]] && extra=(--leak-check full)
  echo "== compute-sanitizer --tool $tool"
  if ! "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 1 "$bin" "$spec"; then
    echo "cuda_sanitize: $tool reported errors" >&2
    rc=1
  fi
done
exit "$rc"
