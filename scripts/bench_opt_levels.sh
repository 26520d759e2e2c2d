#!/usr/bin/env bash
# Compare the host verifiers' speed at -O2 and -O3, with g++ and (when installed) clang++.
#
#   scripts/bench_opt_levels.sh [benchmark-filter-regex]
#
# specula is header-only, so the consumer's optimisation level decides the speed of its loops.
# This builds specula_bench_O2 and specula_bench_O3 (bench/CMakeLists.txt: the chain, tree and
# host-pass benchmarks) with each compiler into $BUILD_DIR-<compiler> (default build-opt-g++,
# build-opt-clang++), then runs every selected case REPS times (default 5), alternating the -O3
# and -O2 binaries case by case so that a change in machine load hits both levels alike, and
# prints a Markdown table of the fastest time per case and level (the least disturbed run) with
# the ratio -O2 / -O3 per compiler.
#
# Environment: BUILD_DIR (prefix, default build-opt), SPECULA_ISA (caps the instruction set of
# the host kernels, see include/specula/core/simd.hpp), MIN_TIME (default 0.05 s per run),
# REPS (default 5).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$SPECULA_ROOT"

filter="${1:-^(passes/|chain/unchecked/seq/.*/V:(32000|128256)/L:8/B:16$|chain/checked/seq/accept_all/V:128256/L:8/B:16$|candidates/.*/V:128256/K:[14]$|tree/unchecked/.*/V:128256/B:16$)}"
prefix="${BUILD_DIR:-build-opt}"
min_time="${MIN_TIME:-0.05}"
reps="${REPS:-5}"
out_dir="$(mktemp -d)"
trap 'rm -rf "$out_dir"' EXIT

compilers=(g++)
command -v clang++ >/dev/null 2>&1 && compilers+=(clang++)

for cxx in "${compilers[@]}"; do
  dir="$prefix-$cxx"
  log "building specula_bench_O2 and specula_bench_O3 with $cxx in $dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
    -DSPECULA_ENABLE_CUDA=OFF -DSPECULA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$dir" -j "$JOBS" --target specula_bench_O2 specula_bench_O3 >/dev/null
done
mapfile -t cases < <("$prefix-${compilers[0]}/bench/specula_bench_O3" \
  --benchmark_list_tests --benchmark_filter="$filter" | grep -v '^stream_read')
log "${#cases[@]} cases x $reps runs x ${#compilers[@]} compilers x 2 levels"
for name in "${cases[@]}"; do
  exact="^$name\$"  # benchmark names hold no regex metacharacters
  for ((rep = 1; rep <= reps; ++rep)); do
    for cxx in "${compilers[@]}"; do
      for level in O3 O2; do
        "$prefix-$cxx/bench/specula_bench_$level" --benchmark_filter="$exact" \
          --benchmark_min_time="$min_time" --benchmark_format=csv 2>/dev/null |
          awk -F, -v c="$cxx" -v l="$level" 'NR > 1 && $1 !~ /stream_read/ {
            u = $5; gsub(/"/, "", u); f = (u == "ns") ? 1e-3 : (u == "ms") ? 1e3 : 1;
            n = $1; gsub(/"/, "", n); print c "," l "," n "," $3 * f }' >>"$out_dir/times.csv"
      done
    done
  done
done

python3 - "$out_dir/times.csv" "${compilers[@]}" <<'PY'
import csv, sys
path, compilers = sys.argv[1], sys.argv[2:]
best, order = {}, []
for c, level, name, t in csv.reader(open(path)):
    if name not in order:
        order.append(name)
    key = (c, level, name)
    best[key] = min(best.get(key, float("inf")), float(t))
print("| benchmark |" + "".join(f" {c} -O3 µs | {c} -O2 µs | -O2/-O3 |" for c in compilers))
print("| --- |" + " ---: | ---: | ---: |" * len(compilers))
for n in order:
    row = f"| `{n}` |"
    for c in compilers:
        a, b = best.get((c, "O3", n)), best.get((c, "O2", n))
        row += f" {a:.1f} | {b:.1f} | {b / a:.2f} |" if a and b else " | | |"
    print(row)
PY
