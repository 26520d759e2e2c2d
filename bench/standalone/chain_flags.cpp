// One program, compiled by hand with different flags, timing verify_chain_unchecked(host::seq)
// on B = 16, L = 8, V = 32000 near-uniform float rows (about 6 drafts accepted per request):
// the median of 31 calls, and a hash of every output so that builds can be compared for
// identical results. docs/PERFORMANCE.md ("Host verification and the consumer's optimisation
// level") gives the commands. Not built by CMake: the point is the consumer's own flags.
//
//   g++ -std=c++20 -O2 -Iinclude bench/standalone/chain_flags.cpp -o chain_flags && ./chain_flags
//
// An optional argument sets the number of calls (default 31), e.g. to count the instructions
// and branch mispredictions of the calls alone under valgrind (run with 31 and with 1 call and
// take the difference).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "specula/verify/chain.hpp"

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 31;
  using namespace specula;
  const index_t batch = 16, length = 8, vocab = 32000;
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> near_one(0.9f, 1.1f);
  auto fill = [&](std::vector<float>& rows, index_t n) {
    rows.resize(static_cast<std::size_t>(n * vocab));
    for (index_t r = 0; r < n; ++r) {
      float* row = rows.data() + r * vocab;
      double sum = 0;
      for (index_t i = 0; i < vocab; ++i) sum += (row[i] = near_one(gen));
      for (index_t i = 0; i < vocab; ++i) row[i] = static_cast<float>(row[i] / sum);
    }
  };
  std::vector<float> q, p;
  fill(q, batch * length);
  fill(p, batch * (length + 1));
  std::vector<index_t> offsets;
  for (index_t b = 0; b <= batch; ++b) offsets.push_back(b * length);
  std::vector<token_t> drafts(static_cast<std::size_t>(batch * length));
  for (auto& d : drafts) d = static_cast<token_t>(gen() % vocab);
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b) rng.push_back({42, static_cast<std::uint32_t>(b), 0});
  std::vector<token_t> out(static_cast<std::size_t>(batch * (length + 1)));
  std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
  const chain_batch_input<float> in{vocab,
                                    offsets,
                                    drafts,
                                    {q.data(), batch * length, vocab},
                                    {p.data(), batch * (length + 1), vocab},
                                    rng};

  std::vector<double> times;
  long total_accepted = 0;
  std::uint64_t hash = 0;
  for (int rep = 0; rep < calls; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    verify_chain_unchecked(host::seq, in, chain_batch_output{out, accepted, {}, {}});
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    for (auto a : accepted) total_accepted += a;
    for (auto o : out) hash = hash * 31 + static_cast<std::uint32_t>(o);
  }
  std::sort(times.begin(), times.end());
  std::printf("median %.1f us, accepted/req %.2f, output hash %016llx\n", times[times.size() / 2],
              static_cast<double>(total_accepted) / calls / static_cast<double>(batch),
              static_cast<unsigned long long>(hash));
}
