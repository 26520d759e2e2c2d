#!/usr/bin/env bash
# Compare the host verifiers' speed at -O2 and -O3, with g++ and (when installed) clang++.
#
#   scripts/bench_opt_levels.sh [benchmark-filter-regex]
#
# specula is header-only, so the consumer's optimisation level decides the speed of its loops.
# This builds specula_bench_O2 and specula_bench_O3 (bench/CMakeLists.txt: the chain, tree and
# host-pass benchmarks) with each compiler into $BUILD_DIR-<compiler> (default build-opt-g++,
# build-opt-clang++), runs the two binaries alternately three times with the same filter (so a
# change in machine load hits both levels alike) and prints a Markdown table of the median times
# with the ratio -O2 / -O3 per compiler.
#
# Environment: BUILD_DIR (prefix, default build-opt), SPECULA_ISA (caps the instruction set of
# the host kernels, see include/specula/core/simd.hpp), MIN_TIME (default 0.1 s per case).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$SPECULA_ROOT"

filter="${1:-^(passes/|chain/unchecked/seq/.*/V:(32000|128256)/L:8/B:16$|chain/checked/seq/accept_all/V:128256/L:8/B:16$|candidates/.*/V:128256/K:[14]$|tree/unchecked/.*/V:128256/B:16$)}"
prefix="${BUILD_DIR:-build-opt}"
min_time="${MIN_TIME:-0.1}"
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
for rep in 1 2 3; do
  for cxx in "${compilers[@]}"; do
    for level in O3 O2; do
      log "run $rep: $cxx -$level"
      "$prefix-$cxx/bench/specula_bench_$level" --benchmark_filter="$filter" \
        --benchmark_min_time="$min_time" \
        --benchmark_out="$out_dir/$cxx-$level-$rep.json" --benchmark_out_format=json >/dev/null
    done
  done
done

python3 - "$out_dir" "${compilers[@]}" <<'PY'
import json, sys, os
out_dir, compilers = sys.argv[1], sys.argv[2:]
import statistics
unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
def medians(compiler, level):
    runs = {}
    for rep in (1, 2, 3):
        with open(os.path.join(out_dir, f"{compiler}-{level}-{rep}.json")) as f:
            for b in json.load(f)["benchmarks"]:
                t = b["real_time"] * unit[b.get("time_unit", "ns")]
                runs.setdefault(b["name"], []).append(t)
    return {n: statistics.median(v) for n, v in runs.items() if not n.startswith("stream_read")}
tables = {(c, l): medians(c, l) for c in compilers for l in ("O3", "O2")}
names = list(tables[(compilers[0], "O3")].keys())
head = "| benchmark |" + "".join(f" {c} -O3 µs | {c} -O2 µs | -O2/-O3 |" for c in compilers)
print(head)
print("| --- |" + " ---: | ---: | ---: |" * len(compilers))
for n in names:
    row = f"| `{n}` |"
    for c in compilers:
        a, b = tables[(c, "O3")].get(n), tables[(c, "O2")].get(n)
        row += f" {a:.1f} | {b:.1f} | {b / a:.2f} |" if a and b else " | | |"
    print(row)
PY
