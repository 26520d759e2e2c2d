// Every bad input of chain verification gets an invalid_input naming the argument and index.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "bad_input_util.hpp"
#include "specula/rules/typical.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/chain_logits.hpp"
#include "specula/verify/greedy.hpp"

using namespace specula;
using specula::test::expected_error;
using specula::test::require_error;

namespace {

/// A valid flattened batch (V = 4, two requests with 2 and 1 drafts) that each case breaks.
struct fixture {
  index_t vocab = 4;
  std::vector<index_t> offsets = {0, 2, 3};
  std::vector<token_t> tokens = {1, 2, 0};
  std::vector<float> draft = {0.25f, 0.25f, 0.25f, 0.25f,  //
                              0.1f,  0.2f,  0.3f,  0.4f,   //
                              0.7f,  0.1f,  0.1f,  0.1f};
  std::vector<float> target = {0.4f,  0.3f,  0.2f,  0.1f,   //
                               0.1f,  0.1f,  0.1f,  0.7f,   //
                               0.25f, 0.25f, 0.25f, 0.25f,  //
                               0.5f,  0.5f,  0.0f,  0.0f,   //
                               0.0f,  1.0f,  0.0f,  0.0f};
  std::vector<request_rng> rng = {{1, 0, 0}, {1, 1, 0}};
  std::vector<token_t> out = std::vector<token_t>(5);
  std::vector<std::int32_t> n = std::vector<std::int32_t>(2);
  std::vector<std::uint8_t> acc = std::vector<std::uint8_t>(3);
  std::vector<std::uint32_t> flags = std::vector<std::uint32_t>(2);

  [[nodiscard]] chain_batch_input<float> in() const {
    return {vocab, offsets, tokens, {draft.data(), 3, 4}, {target.data(), 5, 4}, rng};
  }
  chain_batch_output output() { return {out, n, acc, flags}; }
};

}  // namespace

TEST_CASE("the fixture itself is valid", "[verify][bad_input]") {
  fixture f;
  REQUIRE_NOTHROW(verify_chain(host::seq, f.in(), f.output()));
}

TEST_CASE("bad probability rows (check_level::full scans every row)", "[verify][bad_input]") {
  fixture f;
  chain_options full;
  full.check = check_level::full;
  auto run = [&] { verify_chain(host::seq, f.in(), f.output(), full); };
  SECTION("NaN in target_probs") {
    f.target[4 * 3 + 2] = std::numeric_limits<float>::quiet_NaN();
    require_error(run, {status::nan_value, "target_probs", 3, 2});
  }
  SECTION("+Inf in draft_probs") {
    f.draft[4 * 1 + 1] = std::numeric_limits<float>::infinity();
    require_error(run, {status::inf_value, "draft_probs", 1, 1});
  }
  SECTION("negative entry in target_probs") {
    f.target[0] = -0.1f;
    f.target[1] = 0.5f;
    require_error(run, {status::negative_value, "target_probs", 0, 0});
  }
  SECTION("row sum off by more than the tolerance") {
    f.target[4 * 4 + 1] = 0.9f;
    require_error(run, {status::bad_row_sum, "target_probs", 4, -1});
  }
  SECTION("a looser tolerance accepts that row") {
    f.target[4 * 4 + 1] = 0.9f;
    chain_options o = full;
    o.sum_tolerance = 0.2;
    REQUIRE_NOTHROW(verify_chain(host::seq, f.in(), f.output(), o));
  }
  SECTION("drafted token with zero proposal probability") {
    f.draft[4 * 2 + 0] = 0.0f;
    f.draft[4 * 2 + 1] = 0.8f;
    require_error(run, {status::zero_draft_probability, "draft_probs", 2, 0});
  }
}

TEST_CASE("bad tokens and padding", "[verify][bad_input]") {
  fixture f;
  auto run = [&] { verify_chain(host::seq, f.in(), f.output()); };
  SECTION("token id >= vocab") {
    f.tokens[1] = 4;
    require_error(run, {status::token_out_of_range, "draft_tokens", 1, -1});
  }
  SECTION("negative token id other than -1") {
    f.tokens[2] = -7;
    require_error(run, {status::token_out_of_range, "draft_tokens", 2, -1});
  }
  SECTION("-1 padding inside a flattened request is never read as an index") {
    f.tokens[0] = no_token;
    require_error(run, {status::bad_padding, "draft_tokens", 0, -1});
  }
}

TEST_CASE("bad shapes and empty inputs", "[verify][bad_input]") {
  fixture f;
  SECTION("no requests (B = 0) is a no-op in every entry point, whatever the outputs") {
    for (const std::vector<index_t>& off : {std::vector<index_t>{0}, std::vector<index_t>{}}) {
      const chain_batch_input<float> in{f.vocab, off, {}, {}, {}, {}};
      const chain_batch_output out{{}, {}, {}, {}};
      REQUIRE_NOTHROW(verify_chain(host::seq, in, out));
      REQUIRE_NOTHROW(verify_chain(host::par, in, out));
      REQUIRE_NOTHROW(verify_chain_unchecked(host::seq, in, out));
      REQUIRE_NOTHROW(verify_chain_greedy(host::seq, in, out));
      REQUIRE_NOTHROW(validate_chain_batch(host::seq, in, out));
    }
  }
  SECTION("first offset not 0") {
    f.offsets = {1, 2, 3};
    require_error([&] { verify_chain(host::seq, f.in(), f.output()); },
                  {status::invalid_parameter, "draft_offsets", 0, -1});
  }
  SECTION("decreasing offsets") {
    f.offsets = {0, 3, 2};
    require_error([&] { verify_chain(host::seq, f.in(), f.output()); },
                  {status::invalid_parameter, "draft_offsets", 2, -1});
  }
  SECTION("vocab_size 0") {
    auto in = f.in();
    in.vocab_size = 0;
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::invalid_parameter, "vocab_size", -1, -1});
  }
  SECTION("draft_tokens shorter than the offsets say") {
    auto in = f.in();
    in.draft_tokens.size = 2;
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::length_mismatch, "draft_tokens", -1, -1});
  }
  SECTION("missing target row") {
    auto in = f.in();
    in.target_probs.rows = 4;
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::length_mismatch, "target_probs", -1, -1});
  }
  SECTION("target row length differs from vocab_size") {
    auto in = f.in();
    in.target_probs = {f.target.data(), 4, 5};
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::length_mismatch, "target_probs", -1, -1});
  }
  SECTION("wrong number of draft rows") {
    auto in = f.in();
    in.draft_probs.rows = 2;
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::length_mismatch, "draft_probs", -1, -1});
  }
  SECTION("overlapping rows (stride smaller than the row)") {
    auto in = f.in();
    in.draft_probs.row_stride = 2;
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::length_mismatch, "draft_probs", -1, -1});
  }
  SECTION("one rng per request") {
    auto in = f.in();
    in.rng.size = 1;
    require_error([&] { verify_chain(host::seq, in, f.output()); },
                  {status::length_mismatch, "rng", -1, -1});
  }
  SECTION("output_tokens too short") {
    auto o = f.output();
    o.output_tokens.size = 4;
    require_error([&] { verify_chain(host::seq, f.in(), o); },
                  {status::length_mismatch, "output_tokens", -1, -1});
  }
  SECTION("num_accepted too short") {
    auto o = f.output();
    o.num_accepted.size = 1;
    require_error([&] { verify_chain(host::seq, f.in(), o); },
                  {status::length_mismatch, "num_accepted", -1, -1});
  }
  SECTION("accepted flags of the wrong length") {
    auto o = f.output();
    o.accepted.size = 2;
    require_error([&] { verify_chain(host::seq, f.in(), o); },
                  {status::length_mismatch, "accepted", -1, -1});
  }
  SECTION("flags of the wrong length") {
    auto o = f.output();
    o.flags.size = 3;
    require_error([&] { verify_chain(host::seq, f.in(), o); },
                  {status::length_mismatch, "flags", -1, -1});
  }
  SECTION("negative residual floor") {
    chain_options o;
    o.residual_floor = -1.0;
    require_error([&] { verify_chain(host::seq, f.in(), f.output(), o); },
                  {status::invalid_parameter, "options.residual_floor", -1, -1});
  }
  SECTION("negative sum tolerance") {
    chain_options o;
    o.sum_tolerance = -1.0;
    require_error([&] { verify_chain(host::seq, f.in(), f.output(), o); },
                  {status::invalid_parameter, "options.sum_tolerance", -1, -1});
  }
  SECTION("sum tolerance of 1 or more (would accept a row with no mass)") {
    for (double t : {1.0, 2.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
      chain_options o;
      o.sum_tolerance = t;
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), o); },
                    {status::invalid_parameter, "options.sum_tolerance", -1, -1});
    }
  }
}

TEST_CASE("requests sharing a random stream are refused, naming both", "[verify][bad_input]") {
  fixture f;
  auto run = [&] { verify_chain(host::seq, f.in(), f.output()); };
  SECTION("the same seed and request id (the step does not matter)") {
    f.rng = {{7, 3, 0}, {7, 3, 5}};
    require_error(run, {status::shared_stream, "rng", 1, -1});
    try {
      run();
    } catch (const invalid_input& e) {
      CHECK(std::string(e.what()).find("requests 0 and 1 have the same seed (7) and request_id "
                                       "(3)") != std::string::npos);
    }
  }
  SECTION("the same seed with distinct ids, or distinct seeds, are distinct streams") {
    f.rng = {{7, 3, 0}, {7, 4, 0}};
    REQUIRE_NOTHROW(run());
    f.rng = {{7, 3, 0}, {8, 3, 0}};
    REQUIRE_NOTHROW(run());
  }
  SECTION("validate_chain_batch, greedy-free entry points of every layout") {
    f.rng = {{1, 1, 0}, {1, 1, 0}};
    require_error([&] { validate_chain_batch(f.in(), f.output()); },
                  {status::shared_stream, "rng", 1, -1});
  }
}

TEST_CASE("find_shared_stream names the first shared pair in small and large batches",
          "[verify][bad_input]") {
  for (const index_t batch : {2, 5, 32, 33, 100, 1000}) {
    std::vector<request_rng> rng(static_cast<std::size_t>(batch));
    for (index_t b = 0; b < batch; ++b)
      rng[static_cast<std::size_t>(b)] = {static_cast<std::uint64_t>(b) * 0x9e3779b9ull, 0, 0};
    CHECK(detail::find_shared_stream(rng).second == -1);
    // Two shared pairs: the one whose later request comes first is named.
    const index_t late = batch - 1;
    rng[static_cast<std::size_t>(late)] = rng[0];
    if (batch > 2) rng[static_cast<std::size_t>(batch / 2)] = rng[1];
    const auto s = detail::find_shared_stream(rng);
    CHECK(s.first == (batch > 2 ? 1 : 0));
    CHECK(s.second == (batch > 2 ? batch / 2 : 1));
    // Request ids alone tell streams apart.
    for (index_t b = 0; b < batch; ++b)
      rng[static_cast<std::size_t>(b)] = {42, static_cast<std::uint32_t>(b), 0};
    CHECK(detail::find_shared_stream(rng).second == -1);
  }
}

TEST_CASE("placeholders (-1) inside the counted drafts: refused, or rejected at their position",
          "[verify][bad_input]") {
  fixture f;
  // Request 0 drafts {1, -1}: p_1 is one-hot at 1 (q_1(1) = 0.25: accepted surely), p_2 one-hot
  // at 3 with q_2 uniform, so the token sampled at the placeholder is 3.
  f.tokens = {1, no_token, 0};
  std::fill(f.target.begin(), f.target.begin() + 8, 0.0f);
  f.target[1] = 1.0f;
  f.target[4 + 3] = 1.0f;
  std::fill(f.draft.begin(), f.draft.begin() + 8, 0.25f);
  chain_options reject;
  reject.placeholders = draft_placeholders::reject;
  SECTION("refused by default, with one wording in every entry point") {
    require_error([&] { verify_chain(host::seq, f.in(), f.output()); },
                  {status::bad_padding, "draft_tokens", 1, -1});
    require_error([&] { verify_chain_greedy(host::seq, f.in(), f.output()); },
                  {status::bad_padding, "draft_tokens", 1, -1});
    std::string a, b;
    try {
      verify_chain(host::seq, f.in(), f.output());
    } catch (const invalid_input& e) {
      a = e.what();
    }
    try {
      verify_chain_greedy(host::seq, f.in(), f.output());
    } catch (const invalid_input& e) {
      b = e.what();
    }
    CHECK(a == b);
    CHECK(a.find(detail::placeholder_refused) != std::string::npos);
  }
  SECTION("draft_placeholders::reject: rejected without a draw, a residual sample there") {
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      f.rng = {{seed, 0, 0}, {seed, 1, 0}};
      for (const bool dense : {true, false}) {
        chain_batch_input<float> in = f.in();
        if (!dense) in.draft_probs = {};
        REQUIRE_NOTHROW(verify_chain(host::seq, in, f.output(), reject));
        CHECK(f.n[0] == 1);
        CHECK(f.out[0] == 1);
        CHECK(f.out[1] == 3);
        CHECK(f.acc[1] == 0);
        CHECK((f.flags[0] & chain_valid) != 0);
      }
    }
    // Greedy: the placeholder never equals the argmax, which is emitted there.
    REQUIRE_NOTHROW(verify_chain_greedy(host::seq, f.in(), f.output(), draft_placeholders::reject));
    CHECK(f.n[0] == 1);
    CHECK(f.out[1] == 3);
  }
  SECTION("row-aware rules bind the drafted token: they still refuse placeholders") {
    require_error(
        [&] { verify_chain(host::seq, f.in(), f.output(), reject, typical_rule::make(0.3, 0.09)); },
        {status::bad_padding, "draft_tokens", 1, -1});
  }
}

TEST_CASE("bad padded-layout inputs", "[verify][bad_input]") {
  // B = 2, L = 2, V = 2.
  std::vector<token_t> tokens = {0, 1, 1, no_token};
  std::vector<float> draft(8, 0.5f);
  std::vector<float> target(12, 0.5f);
  std::vector<request_rng> rng = {{1, 0, 0}, {1, 1, 0}};
  std::vector<token_t> out(6);
  std::vector<std::int32_t> n(2);
  padded_chain_input<float> in;
  in.vocab_size = 2;
  in.batch_size = 2;
  in.max_draft = 2;
  in.draft_tokens = tokens;
  in.draft_probs = {draft.data(), 4, 2};
  in.target_probs = {target.data(), 6, 2};
  in.rng = rng;
  const padded_chain_output o{out, n, {}, {}};
  auto run = [&] { verify_chain(host::seq, in, o); };
  REQUIRE_NOTHROW(run());

  SECTION("a token after padding") {
    tokens = {0, 1, no_token, 1};
    require_error(run, {status::bad_padding, "draft_tokens", 1, 1});
  }
  SECTION("padding inside an explicit length") {
    std::vector<std::int32_t> lens = {2, 2};
    in.draft_lengths = lens;
    require_error(run, {status::bad_padding, "draft_tokens", 1, 1});
  }
  SECTION("explicit length larger than max_draft") {
    std::vector<std::int32_t> lens = {3, 1};
    in.draft_lengths = lens;
    require_error(run, {status::invalid_parameter, "draft_lengths", 0, -1});
  }
  SECTION("draft_lengths of the wrong size") {
    std::vector<std::int32_t> lens = {1};
    in.draft_lengths = lens;
    require_error(run, {status::length_mismatch, "draft_lengths", -1, -1});
  }
  SECTION("token out of range reports request and position") {
    tokens[1] = 2;
    require_error(run, {status::token_out_of_range, "draft_tokens", 0, 1});
  }
  SECTION("batch_size 0 is a no-op") {
    in.batch_size = 0;
    const padded_chain_output empty{{}, {}, {}, {}};
    REQUIRE_NOTHROW(verify_chain(host::seq, in, empty));
    REQUIRE_NOTHROW(verify_chain_unchecked(host::seq, in, empty));
  }
  SECTION("negative batch_size") {
    in.batch_size = -1;
    require_error(run, {status::invalid_parameter, "batch_size", -1, -1});
  }
  SECTION("negative max_draft") {
    in.max_draft = -1;
    require_error(run, {status::invalid_parameter, "max_draft", -1, -1});
  }
  SECTION("target rows for B * (L + 1)") {
    in.target_probs.rows = 5;
    require_error(run, {status::length_mismatch, "target_probs", -1, -1});
  }
  SECTION("output_tokens for B * (L + 1)") {
    const padded_chain_output bad{{out.data(), 5}, n, {}, {}};
    require_error([&] { verify_chain(host::seq, in, bad); },
                  {status::length_mismatch, "output_tokens", -1, -1});
  }
}

TEST_CASE("parallel validation reports the same first error as sequential", "[verify][bad_input]") {
  fixture f;
  // Two bad rows: the first in row order must be reported whatever the thread split.
  f.target[4 * 1 + 0] = std::numeric_limits<float>::quiet_NaN();
  f.target[4 * 4 + 1] = -1.0f;
  for (unsigned threads : {1u, 2u, 3u, 5u})
    require_error([&] { verify_chain(host::par.with_threads(threads), f.in(), f.output()); },
                  {status::nan_value, "target_probs", 1, 0});
}

namespace {

/// One request, V = 6, two drafts whose q(x) equals p(x): both are accepted with probability
/// one, so the verifier reads p(x) and q(x) at the drafts and the bonus row p_3 in full (row 2
/// of target_probs), nothing else. With `reject`, p(x) = 0 at the first draft instead: it is
/// rejected and the verifier reads p_1 and q_1 in full (row 0 of both), nothing else.
struct reads_fixture {
  index_t vocab = 6;
  std::vector<index_t> offsets = {0, 2};
  std::vector<token_t> tokens = {1, 4};
  std::vector<float> draft = {0.1f, 0.3f, 0.1f, 0.2f, 0.2f, 0.1f,  //
                              0.2f, 0.1f, 0.1f, 0.1f, 0.4f, 0.1f};
  std::vector<float> target = {0.2f, 0.3f, 0.2f, 0.1f, 0.1f, 0.1f,  //
                               0.1f, 0.2f, 0.1f, 0.1f, 0.4f, 0.1f,  //
                               0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
  std::vector<request_rng> rng = {{3, 0, 0}};
  std::vector<token_t> out = std::vector<token_t>(3);
  std::vector<std::int32_t> n = std::vector<std::int32_t>(1);

  explicit reads_fixture(bool reject) {
    if (reject) {
      target[1] = 0.0f;  // p_1(x_1) = 0: certain rejection
      target[0] = 0.5f;
    }
  }
  [[nodiscard]] chain_batch_input<float> in() const {
    return {vocab, offsets, tokens, {draft.data(), 2, 6}, {target.data(), 3, 6}, rng};
  }
  chain_batch_output output() { return {out, n, {}, {}}; }
};

chain_options at(check_level level) {
  chain_options o;
  o.check = level;
  return o;
}

}  // namespace

TEST_CASE("check_level::reads checks the rows the verifier reads, as it reads them",
          "[verify][bad_input]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SECTION("the fixtures are valid and behave as described") {
    reads_fixture accept(false), reject(true);
    verify_chain(host::seq, accept.in(), accept.output(), at(check_level::full));
    CHECK(accept.n[0] == 2);
    verify_chain(host::seq, reject.in(), reject.output(), at(check_level::full));
    CHECK(reject.n[0] == 0);
  }
  for (const check_level level : {check_level::reads, check_level::full}) {
    INFO("level " << (level == check_level::reads ? "reads" : "full"));
    SECTION("a NaN in the bonus row, which is read in full") {
      reads_fixture f(false);
      f.target[2 * 6 + 3] = nan;
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(level)); },
                    {status::nan_value, "target_probs", 2, 3});
    }
    SECTION("a bad sum in the bonus row") {
      reads_fixture f(false);
      f.target[2 * 6 + 0] = 0.9f;
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(level)); },
                    {status::bad_row_sum, "target_probs", 2, -1});
    }
    SECTION("a negative entry in the proposal row of a rejected draft, which is read in full") {
      reads_fixture f(true);
      f.draft[5] = -0.1f;
      f.draft[4] = 0.4f;
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(level)); },
                    {status::negative_value, "draft_probs", 0, 5});
    }
    SECTION("a NaN at a drafted token's target probability, which is read pointwise") {
      reads_fixture f(false);
      f.target[6 + 4] = nan;
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(level)); },
                    {status::nan_value, "target_probs", 1, 4});
    }
    SECTION("an infinite proposal probability at a drafted token") {
      reads_fixture f(false);
      f.draft[1] = std::numeric_limits<float>::infinity();
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(level)); },
                    {status::inf_value, "draft_probs", 0, 1});
    }
  }
  SECTION("the drafts after a rejection are checked at full but not at reads") {
    // The first draft is rejected for certain: p_2(x_2) and q_2(x_2) are never read.
    for (const bool in_q : {false, true}) {
      INFO((in_q ? "q_2(x_2)" : "p_2(x_2)"));
      reads_fixture f(true);
      if (in_q) {  // q_2(x_2) = 0 in a valid row
        f.draft[6 + 0] += f.draft[6 + 4];
        f.draft[6 + 4] = 0.0f;
      } else {
        f.target[6 + 4] = nan;
      }
      require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(check_level::full)); },
                    in_q ? expected_error{status::zero_draft_probability, "draft_probs", 1, 4}
                         : expected_error{status::nan_value, "target_probs", 1, 4});
      reads_fixture clean(true);
      verify_chain(host::seq, clean.in(), clean.output(), at(check_level::reads));
      REQUIRE_NOTHROW(verify_chain(host::seq, f.in(), f.output(), at(check_level::reads)));
      CHECK(f.out == clean.out);
      CHECK(f.n == clean.n);
    }
  }
  SECTION("a zero or negative q(x) at a draft the verifier tests is refused at reads") {
    reads_fixture zero(false);
    zero.draft[6 + 0] += zero.draft[6 + 4];
    zero.draft[6 + 4] = 0.0f;  // q_2(x_2), tested after the first draft is accepted
    require_error(
        [&] { verify_chain(host::seq, zero.in(), zero.output(), at(check_level::reads)); },
        {status::zero_draft_probability, "draft_probs", 1, 4});
    reads_fixture negative(false);
    negative.draft[1] = -1e-9f;  // q_1(x_1): checked before the acceptance test uses it
    require_error(
        [&] { verify_chain(host::seq, negative.in(), negative.output(), at(check_level::reads)); },
        {status::negative_value, "draft_probs", 0, 1});
  }
  SECTION("one array for both p and q: a failed q(x) is named draft_probs") {
    // p = q: every draft is accepted; q_1(x_1) = p_1(x_1) = 0 fails as a proposal entry only.
    reads_fixture f(false);
    f.target.assign(f.draft.begin(), f.draft.end());
    f.target.insert(f.target.end(), {0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f});
    f.target[1] = 0.0f;
    const chain_batch_input<float> in{
        6, f.offsets, f.tokens, {f.target.data(), 2, 6}, {f.target.data(), 3, 6}, f.rng};
    require_error([&] { verify_chain(host::seq, in, f.output(), at(check_level::reads)); },
                  {status::zero_draft_probability, "draft_probs", 0, 1});
  }
  SECTION("a row that is only read pointwise is scanned at full but not at reads") {
    reads_fixture f(false);
    f.target[6 + 0] = nan;  // p_2 away from the drafted token 4
    require_error([&] { verify_chain(host::seq, f.in(), f.output(), at(check_level::full)); },
                  {status::nan_value, "target_probs", 1, 0});
    reads_fixture clean(false);
    verify_chain(host::seq, clean.in(), clean.output(), at(check_level::reads));
    REQUIRE_NOTHROW(verify_chain(host::seq, f.in(), f.output(), at(check_level::reads)));
    CHECK(f.out == clean.out);  // the entry that was never read cannot change the result
    CHECK(f.n == clean.n);
  }
}

TEST_CASE("int32 offsets and lengths give the results of int64 ones", "[verify]") {
  fixture f;
  verify_chain(host::seq, f.in(), f.output());
  const auto want_out = f.out;
  const auto want_n = f.n;
  const std::vector<std::int32_t> off32(f.offsets.begin(), f.offsets.end());
  auto in = f.in();
  in.draft_offsets = off32;
  std::fill(f.out.begin(), f.out.end(), 99);
  verify_chain(host::seq, in, f.output());
  CHECK(f.out == want_out);
  CHECK(f.n == want_n);
  // Bad int32 offsets are reported like int64 ones.
  const std::vector<std::int32_t> decreasing = {0, 3, 2};
  in.draft_offsets = decreasing;
  require_error([&] { verify_chain(host::seq, in, f.output()); },
                {status::invalid_parameter, "draft_offsets", 2, -1});
}

TEST_CASE("offsets of the platform's other 64-bit type (long long) are accepted", "[verify]") {
  fixture f;
  verify_chain(host::seq, f.in(), f.output());
  const auto want_out = f.out;
  const std::vector<long long> off_ll(f.offsets.begin(), f.offsets.end());
  auto in = f.in();
  in.draft_offsets = off_ll;
  std::fill(f.out.begin(), f.out.end(), 99);
  verify_chain(host::seq, in, f.output());
  CHECK(f.out == want_out);
  const index_view v = row_view<const long long>{off_ll.data(), 3};
  CHECK(v[2] == 3);
  CHECK(v.has_data());
  CHECK_FALSE(index_view(nullptr, 3).has_data());
  static_assert(!std::is_convertible_v<std::vector<unsigned long>&, index_view>);
  static_assert(!std::is_convertible_v<std::vector<short>&, index_view>);
}

TEST_CASE("chain_logits_input takes int32 offsets", "[verify]") {
  // V = 3, one request with one draft; target logits favour the draft.
  const std::vector<float> target = {0.0f, 5.0f, 0.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<token_t> tokens = {1};
  const std::vector<request_rng> rng = {{1, 0, 0}};
  const std::vector<sampling_params> params(1);
  const std::vector<std::int32_t> off32 = {0, 1};
  const std::vector<index_t> off64 = {0, 1};
  std::vector<token_t> out32(2), out64(2);
  std::vector<std::int32_t> n32(1), n64(1);
  chain_logits_input<float> in;
  in.vocab_size = 3;
  in.draft_tokens = tokens;
  in.target_logits = {target.data(), 2, 3};
  in.target_params = params;
  in.rng = rng;
  in.draft_offsets = off32;
  verify_chain_from_logits(host::seq, in, chain_batch_output{out32, n32, {}, {}});
  in.draft_offsets = off64;
  verify_chain_from_logits(host::seq, in, chain_batch_output{out64, n64, {}, {}});
  CHECK(out32 == out64);
  CHECK(n32 == n64);
}
