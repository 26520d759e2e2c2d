// The example of docs/trees.md, compiled and run: build a tree, hand its mask and positions to
// the model, verify its nodes' rows, commit the accepted path.

#include <catch2/catch.hpp>
#include <vector>

#include <specula/tree/builders.hpp>
#include <specula/verify/tree.hpp>

TEST_CASE("docs/trees.md example", "[tree]") {
  //! [tree_example]
  // Two candidates for the next token, and two for the token after the first candidate.
  specula::token_tree tree = specula::trees::first_path_siblings(/*siblings=*/2, /*depth=*/2);
  tree.set_tokens(std::vector<specula::token_t>{specula::no_token, 3, 1, 0, 2});

  // What the model needs to evaluate all nodes in one forward pass.
  const auto mask = tree.attention_mask();      // bit j of row i: node j is visible to node i
  const auto positions = tree.position_ids(7);  // the root sits at position 7

  // One target row per node (p(. | path to node)) and one proposal row per node (the row its
  // children were drawn from, without replacement), V = 4.
  const std::vector<float> p = {0.1f, 0.6f, 0.1f, 0.2f, 0.3f, 0.3f, 0.2f,  0.2f,  0.5f,  0.1f,
                                0.2f, 0.2f, 0.7f, 0.1f, 0.1f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f};
  const std::vector<float> q = {0.1f,  0.3f,  0.1f,  0.5f,  0.4f,  0.1f,  0.4f,
                                0.1f,  0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f,
                                0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
  // The request's random stream for this decoding iteration: step must change every iteration.
  const std::vector<specula::request_rng> rng = {{/*seed=*/1, /*request_id=*/0, /*step=*/0}};
  std::vector<specula::token_t> tokens(5);
  std::vector<specula::index_t> path(5);
  std::vector<std::int32_t> accepted(1);
  const specula::tree_batch_input<float> in{4, {&tree, 1}, {p.data(), 5, 4}, {q.data(), 5, 4}, rng};
  specula::verify_tree(specula::host::seq, in,
                       specula::tree_batch_output{tokens, accepted, path, {}});
  // tokens[0 .. accepted[0]]: the tokens to append (accepted path, then the residual or bonus);
  // path[0 .. accepted[0]]: the accepted nodes, root first — the KV entries to keep.
  //! [tree_example]

  CHECK(mask.size() == 5);
  CHECK(positions == std::vector<specula::index_t>{7, 8, 8, 9, 9});
  REQUIRE(accepted[0] >= 0);
  REQUIRE(accepted[0] <= 2);
  for (int i = 1; i <= accepted[0]; ++i)
    CHECK(tree.parent(path[static_cast<std::size_t>(i)]) == path[static_cast<std::size_t>(i - 1)]);
}
