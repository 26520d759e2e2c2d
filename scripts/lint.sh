#!/usr/bin/env bash
# Static checks in one command:
#   1. clang-format: every C++ source matches .clang-format (--fix rewrites them instead);
#   2. clang-tidy (.clang-tidy: bugprone-*, performance-*, naming incl. reserved identifiers)
#      over every public header, through the generated per-header compile units.
#
#   scripts/lint.sh            # check
#   scripts/lint.sh --fix      # reformat, then run clang-tidy
# Environment: BUILD_DIR (default build-tidy), JOBS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fix=0
[[ "${1:-}" == "--fix" ]] && fix=1
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
BUILD_DIR="${BUILD_DIR:-build-tidy}"

command -v clang-format >/dev/null || { echo "[specula] clang-format not found" >&2; exit 1; }
command -v clang-tidy >/dev/null || { echo "[specula] clang-tidy not found" >&2; exit 1; }

mapfile -t sources < <(git ls-files 'include/*.hpp' 'cuda/*.cuh' 'cuda/*.hpp' 'tests/*.cpp' \
  'tests/*.hpp' 'tests/*.cu' 'bench/*.cpp' 'bench/*.hpp' 'bench/*.cu' 'bench/*.cuh' 'examples/*.cpp' |
  grep -v '^tests/package/')
if ((fix)); then
  clang-format -i "${sources[@]}"
  echo "[specula] clang-format: ${#sources[@]} files rewritten"
else
  clang-format --dry-run --Werror "${sources[@]}"
  echo "[specula] clang-format: ${#sources[@]} files clean"
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DSPECULA_ENABLE_CUDA=OFF \
  -DSPECULA_BUILD_BENCH=OFF -DSPECULA_BUILD_EXAMPLES=OFF >/dev/null
units=("$BUILD_DIR"/tests/header_check/*.cpp)
printf '%s\n' "${units[@]}" |
  xargs -P "$JOBS" -n 1 clang-tidy --config-file=.clang-tidy -p "$BUILD_DIR" --quiet
echo "[specula] clang-tidy: ${#units[@]} header units clean"
