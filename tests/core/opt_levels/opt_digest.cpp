// Prints a digest of the outputs of the host verifiers and row passes on fixed seeds.
//
// tests/CMakeLists.txt builds this file three times, at -O1, -O2 and -O3, and the tests
// core.opt_levels_bit_identical (-O2 against -O3) and core.opt_levels_bit_identical_O1 (-O1, the
// level of the test executables, against -O3) compare the printouts: results must not depend on
// the consumer's optimisation level. Within one run every instruction set this CPU supports is
// forced in turn (core/simd.hpp) and must give the same digest; the program exits 1 otherwise.
//
// Each output line is "<case> <64-bit hash of its outputs>"; the instruction sets compared are
// named on stderr.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "specula/core/simd.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

using namespace specula;

namespace {

/// FNV-1a over the bytes of the values added.
struct digest {
  std::uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  template <class T>
  void add(const T& v) {
    bytes(&v, sizeof v);
  }
  template <class T>
  void add_all(const std::vector<T>& v) {
    for (const T& x : v) add(x);
  }
};

/// A probability row of length v (row id `id`); `sharp` concentrates the mass on few tokens.
std::vector<float> prob_row(index_t v, std::uint32_t id, bool sharp) {
  std::vector<float> row(static_cast<std::size_t>(v));
  double sum = 0;
  for (index_t y = 0; y < v; ++y) {
    const double u = uniform_at(request_rng{13, id, 0}, draw_id{static_cast<std::uint32_t>(y), 0});
    const double w = sharp ? u * u * u * u * u * u : u;
    row[static_cast<std::size_t>(y)] = static_cast<float>(w);
    sum += w;
  }
  for (float& x : row) x = static_cast<float>(x / sum);
  return row;
}

/// Concatenated rows [first, first + count).
std::vector<float> rows(index_t v, std::uint32_t first, index_t count, bool sharp) {
  std::vector<float> out;
  for (index_t r = 0; r < count; ++r) {
    const auto row = prob_row(v, first + static_cast<std::uint32_t>(r), sharp);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

using case_list = std::vector<std::pair<std::string, std::uint64_t>>;

void chain_cases(case_list& out) {
  for (index_t v : {37, 1000, 40000})
    for (bool sharp : {false, true})
      for (bool one_hot : {false, true}) {
        const index_t batch = 8;
        const index_t length = 5;
        const auto q = rows(v, 100, batch * length, sharp);
        const auto p = rows(v, 200, batch * (length + 1), sharp);
        std::vector<index_t> offsets;
        std::vector<token_t> drafts;
        std::vector<request_rng> rng;
        for (index_t b = 0; b <= batch; ++b) offsets.push_back(b * length);
        for (index_t i = 0; i < batch * length; ++i)
          drafts.push_back(static_cast<token_t>((i * 7919) % v));
        for (index_t b = 0; b < batch; ++b)
          rng.push_back(request_rng{5, static_cast<std::uint32_t>(b), 3});
        std::vector<token_t> tokens(static_cast<std::size_t>(batch * (length + 1)));
        std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
        std::vector<std::uint32_t> flags(static_cast<std::size_t>(batch));
        const chain_batch_input<float> in{
            v,
            offsets,
            drafts,
            one_hot ? batch_view<const float>{}
                    : batch_view<const float>{q.data(), batch * length, v},
            {p.data(), batch * (length + 1), v},
            rng};
        verify_chain(host::seq, in, chain_batch_output{tokens, accepted, {}, flags});
        digest d;
        d.add_all(tokens);
        d.add_all(accepted);
        d.add_all(flags);
        std::vector<token_t> greedy_tokens(tokens.size());
        verify_chain_greedy(host::seq, in, chain_batch_output{greedy_tokens, accepted, {}, {}});
        d.add_all(greedy_tokens);
        out.emplace_back("chain/V:" + std::to_string(v) + (sharp ? "/sharp" : "/flat") +
                             (one_hot ? "/one_hot" : "/dense"),
                         d.h);
      }
}

void candidate_cases(case_list& out) {
  for (index_t v : {37, 1000, 40000})
    for (bool sharp : {false, true}) {
      const auto p = prob_row(v, 300, sharp);
      const auto q = prob_row(v, 301, sharp);
      const row_view<const float> pr(p), qr(q);
      digest d;
      for (index_t k = 1; k <= 4; ++k) {
        std::vector<token_t> cand;
        for (index_t j = 0; j < k; ++j) cand.push_back(static_cast<token_t>((j * 31 + 3) % v));
        std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)));
        for (std::uint32_t seed = 0; seed < 16; ++seed) {
          philox_source s1{request_rng{seed, 1, 0}}, s2{request_rng{seed, 2, 0}},
              s3{request_rng{seed, 3, 0}};
          const auto a = verify_candidates(exact_rule{}, s1, pr, without_replacement<float>{qr},
                                           cand.data(), k, default_residual_floor, 0, ws.data());
          const auto b = verify_candidates(exact_rule{}, s2, pr, with_replacement<float>{qr},
                                           cand.data(), k, default_residual_floor, 0, ws.data());
          const auto c = verify_candidates(exact_rule{}, s3, pr, one_hot_candidates{}, cand.data(),
                                           k, default_residual_floor, 0, ws.data());
          for (const auto& r : {a, b, c}) {
            d.add(r.accepted);
            d.add(r.token);
            d.add(r.flags);
          }
        }
      }
      out.emplace_back("candidates/V:" + std::to_string(v) + (sharp ? "/sharp" : "/flat"), d.h);
    }
}

void tree_cases(case_list& out) {
  for (index_t v : {1000, 40000})
    for (bool with_q : {false, true}) {
      const index_t batch = 4;
      std::vector<token_tree> trees;
      index_t nodes = 0;
      for (index_t b = 0; b < batch; ++b) {
        token_tree t = trees::sjd_pac(3, 2, 16);
        for (index_t u = 0; u < t.size(); ++u) {
          token_t next = static_cast<token_t>(b + 1);
          for (index_t c : t.children(u)) t.set_token(c, next++);
        }
        nodes += t.size();
        trees.push_back(std::move(t));
      }
      const auto p = rows(v, 400, nodes, true);
      const auto q = rows(v, 500, nodes, true);
      std::vector<request_rng> rng;
      for (index_t b = 0; b < batch; ++b)
        rng.push_back(request_rng{21, static_cast<std::uint32_t>(b), 1});
      std::vector<token_t> tokens(static_cast<std::size_t>(nodes));
      std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
      const tree_batch_input<float> in{
          v,
          trees,
          {p.data(), nodes, v},
          with_q ? batch_view<const float>{q.data(), nodes, v} : batch_view<const float>{},
          rng};
      tree_workspace ws;
      verify_tree(host::seq, in, tree_batch_output{tokens, accepted, {}, {}}, ws);
      digest d;
      d.add_all(tokens);
      d.add_all(accepted);
      out.emplace_back("tree/V:" + std::to_string(v) + (with_q ? "/dense" : "/one_hot"), d.h);
    }
}

void pass_cases(case_list& out) {
  digest d;
  for (index_t v : {1, 9, 257, 4099, 131072 + 333}) {
    auto row = prob_row(v, 600, false);
    const auto diag = check_probability_row(row_view<const float>(row), 1e-3);
    d.add(diag.code);
    d.add(diag.value);
    d.add(positive_mass(v, detail::row_weights<float>{row_view<const float>(row)}));
    d.add(argmax_lowest(row_view<const float>(row)));
    std::vector<float> probs(row.size());
    softmax(std::span<const float>(row), std::span<float>(probs));
    d.add_all(probs);
  }
  out.emplace_back("passes", d.h);
}

case_list run_all() {
  case_list out;
  chain_cases(out);
  candidate_cases(out);
  tree_cases(out);
  pass_cases(out);
  return out;
}

}  // namespace

int main() {
  std::vector<simd::isa> paths = {simd::isa::scalar};
  for (simd::isa i : {simd::isa::sse2, simd::isa::avx2, simd::isa::avx512})
    if (static_cast<int>(i) <= static_cast<int>(simd::supported_isa())) paths.push_back(i);

  simd::force_isa(paths.front());
  const case_list reference = run_all();
  int status = 0;
  std::string compared = simd::name(paths.front());
  for (std::size_t k = 1; k < paths.size(); ++k) {
    simd::force_isa(paths[k]);
    const case_list other = run_all();
    compared += std::string(" ") + simd::name(paths[k]);
    for (std::size_t c = 0; c < reference.size(); ++c)
      if (other[c].second != reference[c].second) {
        std::fprintf(stderr, "%s differs between %s and %s\n", reference[c].first.c_str(),
                     simd::name(paths.front()), simd::name(paths[k]));
        status = 1;
      }
  }
  for (const auto& [name, hash] : reference)
    std::printf("%s %016llx\n", name.c_str(), static_cast<unsigned long long>(hash));
  // Not part of the compared digest: which sets this run compared (stderr).
  std::fprintf(stderr, "instruction sets compared: %s\n", compared.c_str());
  return status;
}
