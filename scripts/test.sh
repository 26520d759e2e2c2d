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
#              SPECULA_PYTHON (the interpreter of that environment).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$SPECULA_ROOT"
ensure_deps

BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
read -r -a extra_cmake_args <<<"${CMAKE_ARGS:-}"

t_total=$(now_s)

t=$(now_s)
log "configure ($BUILD_DIR, $BUILD_TYPE)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${extra_cmake_args[@]}"
t_configure=$(elapsed "$t")

t=$(now_s)
log "build (-j $JOBS)"
cmake --build "$BUILD_DIR" -j "$JOBS"
t_build=$(elapsed "$t")

# conan for the package.conan_create test (best effort; the test skips without it).
ensure_conan "$(cd "$BUILD_DIR" && pwd)/.venv"

# The Python package for the python.pytest test (skips without PyPI access).
t=$(now_s)
ensure_python_package "$(cd "$BUILD_DIR" && pwd)/python-package"
t_python=$(elapsed "$t")

t=$(now_s)
log "test"
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@" || rc=$?
t_test=$(elapsed "$t")

log "timing: configure $t_configure, build $t_build, python package $t_python, test $t_test," \
    "total $(elapsed "$t_total")"
if ((rc != 0)); then
  log "tests FAILED (ctest exit $rc)"
fi
exit "$rc"
