#!/usr/bin/env bash
# Configure, build and test specula.
#
#   scripts/test.sh [ctest args...]      e.g. scripts/test.sh -L core
#
# Environment: BUILD_DIR (default: build), BUILD_TYPE (default: Release),
#              JOBS (default: nproc), CMAKE_ARGS (extra configure arguments),
#              SPECULA_WERROR=ON (warnings as errors),
#              SPECULA_NO_CONAN=1 (do not pip-install conan into $BUILD_DIR/.venv
#              when it is not on PATH; package.conan_create is then skipped),
#              SPECULA_NO_PYTHON=1 (do not build the Python package into
#              $BUILD_DIR/python-package/venv; python.pytest is then skipped),
#              SPECULA_PYTHON (the interpreter of that environment),
#              SPECULA_CUDA_SASS=1 (compile the CUDA code to optimised sm_90 machine code even without a
#              GPU; by default a machine without a visible GPU compiles it to PTX only, see below),
#              SPECULA_NO_LLAMA_CPP=1 (do not fetch and build llama.cpp for the `llama` tests;
#              they are then not configured). llama.cpp is fetched from PyPI and built once into
#              ~/.cache/specula (scripts/llama_cpp.sh), in the background while the rest builds;
#              without PyPI access the `llama` tests report skipped.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$SPECULA_ROOT"
ensure_deps

BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
read -r -a extra_cmake_args <<<"${CMAKE_ARGS:-}"

t_total=$(now_s)

# llama.cpp (libllama + ggml) and the gguf package for the `llama` tests, in the background:
# nothing to do when the cache already holds them.
mkdir -p "$BUILD_DIR"
llama_pid=""
with_llama=OFF
defer_demo=OFF
if [[ "${SPECULA_NO_LLAMA_CPP:-0}" != 1 ]]; then
  if scripts/llama_cpp.sh --ready; then
    with_llama=ON  # cached: configure it from the start
  else
    log "llama.cpp: scripts/llama_cpp.sh in the background (log: $BUILD_DIR/llama_cpp.log)"
    # The gguf environment first (pip, one core): at the end it would leave the other core idle.
    { scripts/llama_cpp.sh --python && scripts/llama_cpp.sh; } >/dev/null 2>"$BUILD_DIR/llama_cpp.log" &
    llama_pid=$!
    defer_demo=ON  # specula_demo links llama.cpp when it is there: built once, after the wait
  fi
fi

# Without a GPU the device tests skip, so the CUDA code only has to compile: it is compiled to
# PTX only (CMAKE_CUDA_ARCHITECTURES=90-virtual) and without optimisation
# (SPECULA_CUDA_COMPILE_ONLY: NVVM at -O0, the CUDA targets' host code at -O0). Every kernel
# still goes through nvcc's front end and NVVM; ptxas, which turns PTX into sm_90 machine code
# and took about a third of the CUDA build, does not run, and NVVM's optimiser, which took
# about two thirds of the rest, does not either. A machine with a GPU (and
# scripts/gpu_check.sh, which configures its own tree for sm_90) builds optimised machine code
# as before.
if [[ "${SPECULA_CUDA_SASS:-0}" != 1 && " ${CMAKE_ARGS:-} " != *CMAKE_CUDA_ARCHITECTURES* ]] &&
  ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  log "no GPU visible: CUDA code compiled to unoptimised PTX only (SPECULA_CUDA_SASS=1 for" \
      "optimised sm_90 code)"
  extra_cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES=90-virtual -DSPECULA_CUDA_COMPILE_ONLY=ON)
fi

# Ninja where it is installed (ensure_deps installs it), for a new build folder: it schedules
# every target's files in one graph and keeps both cores busy, where Make's recursive steps per
# target can leave one idle. An existing folder keeps its generator (CMake refuses to change it).
if [[ " ${CMAKE_ARGS:-} " != *" -G"* && -z "${CMAKE_GENERATOR:-}" && ! -f "$BUILD_DIR/CMakeCache.txt" ]] &&
  command -v ninja >/dev/null 2>&1; then
  extra_cmake_args+=(-G Ninja)
fi

t=$(now_s)
log "configure ($BUILD_DIR, $BUILD_TYPE)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DSPECULA_WITH_LLAMA_CPP="$with_llama" \
  -DSPECULA_DEFER_DEMO="$defer_demo" "${extra_cmake_args[@]}"
t_configure=$(elapsed "$t")

t=$(now_s)
log "build (-j $JOBS)"
cmake --build "$BUILD_DIR" -j "$JOBS"
t_build=$(elapsed "$t")

# conan for the package.conan_create test (best effort; the test skips without it).
ensure_conan "$(cd "$BUILD_DIR" && pwd)/.venv"

# The Python package for the python.pytest test (skips without PyPI access), in the background
# while llama.cpp finishes and its targets build: that end of the build leaves one core idle at
# times (pip, CMake's configure, the demo's one long translation unit). Its output is shown when
# it is done.
t_python_start=$(now_s)
python_dir="$(cd "$BUILD_DIR" && pwd)/python-package"
mkdir -p "$python_dir"
{
  ensure_python_package "$python_dir"
  elapsed "$t_python_start" >"$python_dir/elapsed"
} >"$python_dir/output.log" 2>&1 &
python_pid=$!

# The llama.cpp integration (a cold cache): wait for the background build, then configure and
# build the `llama` targets (the script's exit status 2, no PyPI access, makes the tests report
# skipped).
t=$(now_s)
if [[ -n "$llama_pid" ]]; then
  log "llama.cpp: waiting for scripts/llama_cpp.sh"
  wait "$llama_pid" || log "llama.cpp: scripts/llama_cpp.sh failed (see $BUILD_DIR/llama_cpp.log)"
  cat "$BUILD_DIR/llama_cpp.log" >&2
  cmake -S . -B "$BUILD_DIR" -DSPECULA_WITH_LLAMA_CPP=ON -DSPECULA_DEFER_DEMO=OFF >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
t_llama=$(elapsed "$t")

wait "$python_pid" || true
cat "$python_dir/output.log" >&2
t_python="$(cat "$python_dir/elapsed" 2>/dev/null || echo '?')"

t=$(now_s)
log "test"
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@" || rc=$?
t_test=$(elapsed "$t")

log "timing: configure $t_configure, build $t_build, python package $t_python (in the" \
    "background from the end of the build), llama.cpp wait + build $t_llama, test $t_test," \
    "total $(elapsed "$t_total")"
if ((rc != 0)); then
  log "tests FAILED (ctest exit $rc)"
fi
exit "$rc"
