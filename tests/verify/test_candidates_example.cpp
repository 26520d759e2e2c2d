// The K-candidates example of docs/trees.md, compiled and run.

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include <specula/verify.hpp>

TEST_CASE("docs/trees.md example: K candidates at one position", "[verify]") {
  //! [candidates_example]
  // One position, V = 5: the target row p, the proposal row q, and K = 2 candidates drawn
  // from q without replacement (distinct tokens).
  const std::vector<float> p = {0.1f, 0.4f, 0.2f, 0.2f, 0.1f};
  const std::vector<float> q = {0.3f, 0.3f, 0.2f, 0.1f, 0.1f};
  const std::vector<specula::token_t> candidates = {1, 0};
  // The request's stream at this decoding step (step must change every step; see api.md).
  const specula::philox_source source{{/*seed=*/7, /*request_id=*/0, /*step=*/0}};
  std::vector<double> workspace(static_cast<std::size_t>(specula::candidates_workspace_size(2)));
  const specula::candidates_result r = specula::verify_candidates(
      specula::exact_rule{}, source, specula::row_view<const float>(p),
      specula::without_replacement<float>{specula::row_view<const float>(q)}, candidates.data(),
      /*k=*/2, specula::default_residual_floor, /*position=*/0, workspace.data());
  // r.accepted: index of the accepted candidate, or -1 when all were rejected; r.token: the
  // token to emit (the accepted candidate, or the residual sample). Its law is exactly p.
  //! [candidates_example]

  REQUIRE(r.accepted >= -1);
  REQUIRE(r.accepted < 2);
  CHECK((r.flags & specula::chain_valid) != 0);
  if (r.accepted >= 0)
    CHECK(r.token == candidates[static_cast<std::size_t>(r.accepted)]);
  else
    CHECK((r.token >= 0 && r.token < 5));
}
