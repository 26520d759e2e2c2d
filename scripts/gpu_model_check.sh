#!/usr/bin/env bash
# The example transformer on the GPU, in one short device run (a step of the prepared GPU check):
#   1. the device tests of the model (tests/cuda/model: forward vs host on every shipped model's
#      held-out windows, commit/rollback vs recomputation, greedy loops vs host greedy, SSD vs
#      host stepwise, sampled and resident SD G-tests, resident SD's bytes to the host, resident
#      tree SD, SJD / SJD-PAC, Cool-SD and SSD, CUDA graphs against direct launches);
#   2. scripts/demo.sh's tables with every model on the GPU (DEMO_DEVICE=cuda), one round;
#   3. when built, specula_bench_device_model: a pass of 1..64 tree nodes and the weights' copy.
#
#   scripts/gpu_model_check.sh [task ...]    tasks for the tables (default: text diffusion image)
#
# Needs a build with CUDA in BUILD_DIR (default: build) holding specula_test_cuda_model and
# specula_demo (`cmake --build build --target specula_test_cuda_model specula_demo`); builds
# nothing itself. Environment: BUILD_DIR, GPU_MODEL_TEST_TIMEOUT (seconds, default 240),
# GPU_MODEL_DEMO_TIMEOUT (seconds, default 240). Exits non-zero when a test fails.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$SPECULA_ROOT"

BUILD_DIR="${BUILD_DIR:-build}"
test_exe="$BUILD_DIR/tests/specula_test_cuda_model"
demo_exe="$BUILD_DIR/examples/demo/specula_demo"
[[ -x "$test_exe" ]] || die "$test_exe was not built (a CUDA build: --target specula_test_cuda_model)"
[[ -x "$demo_exe" ]] || die "$demo_exe was not built (--target specula_demo)"
tasks=("$@")
((${#tasks[@]} > 0)) || tasks=(text diffusion image)

if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L || true; fi
log "device tests of the example transformer"
rc=0
timeout "${GPU_MODEL_TEST_TIMEOUT:-240}" "$test_exe" --durations yes || rc=$?
((rc == 77)) && die "no CUDA device: the device tests were skipped"
((rc == 0)) || log "device tests FAILED (exit $rc)"

log "demo tables on the GPU: ${tasks[*]}"
DEMO_SKIP_BUILD=1 DEMO_DEVICE=cuda DEMO_REPEATS=1 BUILD_DIR="$BUILD_DIR" \
  timeout "${GPU_MODEL_DEMO_TIMEOUT:-240}" scripts/demo.sh "${tasks[@]}" || {
  log "demo tables FAILED"
  rc=1
}
bench_exe="$BUILD_DIR/bench/specula_bench_device_model"
if [[ -x "$bench_exe" ]]; then
  log "pass cost against tree nodes"
  timeout 120 "$bench_exe" --benchmark_min_time=0.2 || log "benchmark FAILED"
fi
exit "$rc"
