// The checked row-pass kernels (check_level::reads) against the unchecked ones, alone: CPU time
// per row of detail::dense_tile_sums over R rows cycled in turn (R = 16 rows of V = 32000
// floats: the rows sit in L2/L3 as in the chain benchmark; R = 200: they come from memory), a
// bonus row (max(p, 0)) and a residual pair (max(p - q, 0)), AVX2 and AVX-512 forced in turn,
// best of 15 interleaved repetitions. A plain program (not a ctest):
//
//   g++ -O3 -std=c++20 -DNDEBUG -Iinclude bench/standalone/checked_kernels.cpp -o checked_kernels
//   ./checked_kernels [V [R]]

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "specula/core/simd.hpp"

using namespace specula;

namespace {

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const index_t V = argc > 1 ? std::atol(argv[1]) : 32000;
  const int R = argc > 2 ? std::atoi(argv[2]) : 16;
  const auto stride = static_cast<std::size_t>(V) + 64;
  std::vector<float> buf(stride * 2 * static_cast<std::size_t>(R));
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<float>((i * 2654435761u) % 1000) / (500.0f * static_cast<float>(V));
  double sink = 0;
  auto pass = [&](int variant) {  // bit 0: checked; bit 1: residual (with q)
    for (int r = 0; r < R; ++r) {
      dense_f32_weights f{buf.data() + stride * (2 * static_cast<std::size_t>(r))};
      if (variant >= 2) f.q = f.p + stride;
      double sums[detail::tiles_per_chunk];
      detail::dense_scan scan;
      const index_t chunk = detail::tiles_per_chunk * detail::sum_tile;
      for (index_t t = 0; t < V; t += chunk) {
        const index_t end = V - t < chunk ? V : t + chunk;
        if ((variant & 1) != 0)
          detail::dense_tile_sums<true>(f, t, end, V, detail::sum_tile, sums, &scan);
        else
          detail::dense_tile_sums<false>(f, t, end, V, detail::sum_tile, sums);
        sink += sums[0];
      }
      sink += scan.p_sum + scan.q_sum;
    }
  };
  const char* names[] = {"row, unchecked", "row, checked", "residual, unchecked",
                         "residual, checked"};
  for (simd::isa isa : {simd::isa::avx2, simd::isa::avx512}) {
    if (simd::force_isa(isa) != isa) continue;
    std::vector<double> best(4, 1e9);
    for (int rep = 0; rep < 15; ++rep)
      for (int v = 0; v < 4; ++v) {
        const double t0 = thread_seconds();
        pass(v);
        best[static_cast<std::size_t>(v)] =
            std::min(best[static_cast<std::size_t>(v)], (thread_seconds() - t0) / R * 1e6);
      }
    for (int v = 0; v < 4; ++v)
      std::printf("%-7s V = %ld, R = %d  %-20s %7.3f us per row\n", simd::name(isa),
                  static_cast<long>(V), R, names[v], best[static_cast<std::size_t>(v)]);
    std::printf("        checked / unchecked: row %.3f, residual %.3f\n", best[1] / best[0],
                best[3] / best[2]);
  }
  return sink == 12345.0 ? 1 : 0;
}
