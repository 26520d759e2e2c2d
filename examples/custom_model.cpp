// Plugging a model into specula's Model concept (docs/backend.md).
//
// A model is anything with vocab_size(), evaluate(tree, logits) and commit(path). This example
// writes one decoding loop against the concept and runs it on two models: a user-written bigram
// table, and the example transformer backend with the shipped text-target model.
//
//   specula_example_custom_model [models_dir]

#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <specula/decode/concepts.hpp>
#include <specula_example/sessions.hpp>

namespace {

//! [bigram_model]
/// A user model: the next-token logits depend on the current token only.
class bigram_model {
 public:
  explicit bigram_model(specula::index_t vocab) : vocab_(vocab) {}

  [[nodiscard]] specula::index_t vocab_size() const { return vocab_; }

  /// One logit row per tree node: the row of the node's own token (node 0 is the last
  /// committed token; a real model would also attend to the committed context and to the
  /// node's ancestors in the tree).
  void evaluate(const specula::token_tree& nodes, specula::batch_view<float> logits) {
    for (specula::index_t i = 0; i < nodes.size(); ++i)
      for (specula::index_t v = 0; v < vocab_; ++v)
        logits[i][v] = v == (nodes.token(i) * 7 + 3) % vocab_ ? 1.0f : 0.0f;
  }

  /// Keeps the accepted path (a real model appends those nodes' keys/values to its cache and
  /// drops the other nodes' ones).
  void commit(std::span<const specula::index_t> path) {
    committed_ += static_cast<specula::index_t>(path.size());
  }

 private:
  specula::index_t vocab_;
  specula::index_t committed_ = 0;
};
static_assert(specula::model<bigram_model>);
//! [bigram_model]

//! [greedy_loop]
/// Greedy generation written once against the concept: each step evaluates a one-node tree
/// (the last token), takes the argmax and commits the node.
template <specula::model Model>
std::vector<specula::token_t> generate_greedy(Model& m, specula::token_t last, int steps) {
  const specula::index_t V = m.vocab_size();
  std::vector<float> row(static_cast<std::size_t>(V));
  std::vector<specula::token_t> out;
  for (int s = 0; s < steps; ++s) {
    const specula::token_tree node(std::vector<specula::index_t>{-1},
                                   std::vector<specula::token_t>{last});
    m.evaluate(node, specula::batch_view<float>(row.data(), 1, V));
    specula::token_t best = 0;
    for (specula::index_t v = 1; v < V; ++v)
      if (row[static_cast<std::size_t>(v)] > row[static_cast<std::size_t>(best)])
        best = static_cast<specula::token_t>(v);
    const specula::index_t root = 0;
    m.commit(std::span<const specula::index_t>(&root, 1));
    out.push_back(best);
    last = best;
  }
  return out;
}
//! [greedy_loop]

}  // namespace

int main(int argc, char** argv) {
  bigram_model bigram(16);
  const auto a = generate_greedy(bigram, 1, 8);
  std::printf("bigram model:");
  for (const auto t : a) std::printf(" %d", t);
  std::printf("\n");

  //! [transformer_session]
  const std::filesystem::path dir = argc > 1 ? argv[1] : SPECULA_MODELS_DIR;
  const auto model = specula::example::transformer::load(dir / "text-target.safetensors");
  specula::example::transformer_session session(model);
  const std::string prompt = "def main():\n    ";
  const std::vector<specula::token_t> tokens(prompt.begin(), prompt.end());  // byte tokens
  session.prefill(tokens);  // commits all but the last token, which roots the first step
  const auto b = generate_greedy(session, tokens.back(), 48);
  //! [transformer_session]
  std::printf("text-target greedy continuation of %s", prompt.c_str());
  for (const auto t : b) std::printf("%c", static_cast<char>(t));
  std::printf("\n");
  return 0;
}
