// SJD and SJD-PAC (each combination of Adaptive Continuation and Proactive Drafting, both
// window initialisations): the output law is the target's (G-tests on toy models with known
// laws, 10^6 generations each), a biased verifier fails the same test, and bad input is
// rejected.

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include <specula/decode/sjd.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

namespace {

template <class Verifier = tree_verifier<>>
std::vector<std::uint64_t> sjd_counts(const toy_ar_model& model, const sjd_options& opt,
                                      std::uint32_t runs, std::uint64_t seed, decode_stats* stats,
                                      const Verifier& v = {}) {
  toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(model.num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const auto out = sjd_decode(s, prompt, opt, request_rng{seed, r, 0}, stats, v);
    REQUIRE(static_cast<index_t>(out.size()) == model.horizon());
    ++counts[static_cast<std::size_t>(model.sequence_index(out))];
  }
  return counts;
}

}  // namespace

TEST_CASE("SJD and SJD-PAC sample the target's sequence law (G-tests)", "[decode][stats]") {
  // V = 4 and 5 positions (1024 sequences) with a window of 3 (shorter than the sequence, so
  // windows are refilled from stale rows); the toy rows are sparse, so residuals and
  // without-replacement exclusions are exercised. PD uses K = 2 candidates at depth 1, or at
  // depths 1..D for D = 2, 3: then siblings are also drawn from the stale row
  // row(1, 2, 2) = (1 - 1.4e-7, 0, 1.4e-7, 0), nearly one-hot in float (reachable only as a
  // depth-2 stale row), which the tree verifier once renormalised by 1 - removed mass:
  // these variants failed with p ~ 1e-14.
  const toy_ar_model model(4, 5, 77, 0.3);
  const auto law = model.sequence_law();
  struct variant {
    const char* name;
    bool ac, pd;
    sjd_init init;
    index_t depth = 1;
  };
  for (const variant v :
       {variant{"SJD", false, false, sjd_init::one_hot_q},
        variant{"SJD+PD", false, true, sjd_init::uniform_q},
        variant{"SJD+AC", true, false, sjd_init::uniform_q},
        variant{"SJD+PD+AC", true, true, sjd_init::one_hot_q},
        variant{"SJD+AC, horizontal repeat", true, false, sjd_init::horizontal_repeat},
        variant{"SJD+PD, horizontal sample", false, true, sjd_init::horizontal_sample},
        variant{"SJD+PD, D = 2", false, true, sjd_init::one_hot_q, 2},
        variant{"SJD+PD+AC, D = 2", true, true, sjd_init::uniform_q, 2},
        variant{"SJD+PD, D = 3", false, true, sjd_init::uniform_q, 3},
        variant{"SJD+PD+AC, D = 3", true, true, sjd_init::one_hot_q, 3}}) {
    sjd_options opt;
    opt.window = 3;
    opt.max_new_tokens = 5;
    opt.adaptive_continuation = v.ac;
    opt.proactive_drafting = v.pd;
    opt.pd_width = 2;
    opt.pd_depth = v.depth;
    opt.init = v.init;
    decode_stats st;
    INFO(v.name);
    decode_testing::check_sequence_law(sjd_counts(model, opt, 1'000'000, 31, &st), law, st,
                                       5'000'000);
  }
}

TEST_CASE("a biased verifier fails the SJD G-test", "[decode][stats]") {
  const toy_ar_model model(4, 5, 77, 0.3);
  sjd_options opt = sjd_options::sjd_pac(3, 2, 1);
  opt.max_new_tokens = 5;
  const auto counts =
      sjd_counts(model, opt, 200'000, 32, nullptr, decode_testing::first_path_verifier{});
  CHECK(specula::testing::g_test(counts, model.sequence_law()).p_value < 1e-6);
}

TEST_CASE("SJD-PAC is reproducible per request seed", "[decode]") {
  const toy_ar_model model(4, 5, 78);
  toy_model_session s(model);
  const auto opt = sjd_options::sjd_pac(4, 3, 1);
  const std::vector<token_t> prompt{0};
  CHECK(sjd_decode(s, prompt, opt, request_rng{5, 1, 0}) ==
        sjd_decode(s, prompt, opt, request_rng{5, 1, 0}));
}

TEST_CASE("SJD rejects bad input", "[decode]") {
  const toy_ar_model model(3, 4, 1);
  toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  const auto fails_with = [&](sjd_options o, const std::string& what) {
    CHECK_THROWS_WITH(sjd_decode(s, prompt, o, request_rng{}), Catch::Contains(what));
  };
  sjd_options o;
  o.window = 0;
  fails_with(o, "window");
  o = {};
  o.max_new_tokens = 0;
  fails_with(o, "max_new_tokens");
  o = {};
  o.pd_width = 0;
  fails_with(o, "pd_width");
  o = {};
  o.pd_depth = 0;
  fails_with(o, "pd_depth");
  o = sjd_options::sjd_pac(4, 60, 3);  // 60 + 3600 + 216000 candidate nodes
  fails_with(o, "pd_depth");
  CHECK_THROWS_WITH(sjd_decode(s, std::vector<token_t>{}, sjd_options{}, request_rng{}),
                    Catch::Contains("prompt"));
}
