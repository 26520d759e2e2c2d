// Positive control: conforming types compile.
#include "concept_checks.hpp"

struct good_model {
  specula::index_t vocab_size() const { return 4; }
  void evaluate(const specula::token_tree&, specula::batch_view<float>) {}
  void commit(std::span<const specula::index_t>) {}
};
struct good_batch {
  specula::index_t vocab_size() const { return 4; }
  specula::index_t batch_size() const { return 2; }
  void evaluate(std::span<const specula::index_t>, std::span<const specula::token_tree>,
                specula::batch_view<float>) {}
  void commit(specula::index_t, std::span<const specula::index_t>) {}
  void prefill(specula::index_t, std::span<const specula::token_t>) {}
  specula::index_t context_size(specula::index_t) const { return 0; }
  void rollback(specula::index_t, specula::index_t) {}
};
struct good_proposal {
  bool propose(std::span<const specula::token_t>, specula::token_tree&, std::vector<float>&) {
    return false;
  }
};

int main() {
  good_model m;
  good_proposal p;
  good_batch b;
  use_model(m);
  use_batched_model(b);
  use_proposal(p);
  use_verifier(specula::tree_verifier<>{});
  use_verifier(specula::greedy_tree_verifier<>{});
}
