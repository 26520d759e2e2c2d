// The README's example, compiled and run.

#include <catch2/catch.hpp>
#include <vector>

#include <specula/verify.hpp>

TEST_CASE("README example: verifying a chain", "[verify]") {
  // One request, two drafted tokens over a vocabulary of 4.
  std::vector<float> q = {0.7f, 0.1f, 0.1f, 0.1f,       // q_1: proposal rows of the drafts
                          0.1f, 0.2f, 0.3f, 0.4f};      // q_2
  std::vector<float> p = {0.4f,  0.3f,  0.2f,  0.1f,    // p_1: target rows, one more than drafts
                          0.1f,  0.1f,  0.1f,  0.7f,    // p_2
                          0.25f, 0.25f, 0.25f, 0.25f};  // p_3: for the bonus token
  std::vector<specula::index_t> offsets = {0, 2};  // request b's drafts: [offsets[b], offsets[b+1])
  std::vector<specula::token_t> drafts = {0, 3};
  // The request's random stream for this decoding iteration: step must change every iteration.
  std::vector<specula::request_rng> rng = {{/*seed=*/42, /*request_id=*/0, /*step=*/0}};

  std::vector<specula::token_t> out(3);  // accepted drafts, then correction/bonus, then -1
  std::vector<std::int32_t> accepted(1);
  specula::chain_batch_input<float> in{4, offsets, drafts, {q.data(), 2, 4}, {p.data(), 3, 4}, rng};
  specula::verify_chain(specula::host::seq, in, specula::chain_batch_output{out, accepted, {}, {}});

  REQUIRE(accepted[0] >= 0);
  REQUIRE(accepted[0] <= 2);
  for (int i = 0; i < accepted[0]; ++i)
    CHECK(out[static_cast<std::size_t>(i)] == drafts[static_cast<std::size_t>(i)]);
  const auto last = out[static_cast<std::size_t>(accepted[0])];
  CHECK((last >= 0 && last < 4));
}
