// A batched model whose evaluate() takes every request's tree but no request list: must not
// compile (the batched loops evaluate the subset of requests still running).
#include <span>

#include "concept_checks.hpp"

struct all_requests_batch {
  specula::index_t vocab_size() const { return 4; }
  specula::index_t batch_size() const { return 2; }
  void evaluate(std::span<const specula::token_tree>, specula::batch_view<float>) {}
  void commit(specula::index_t, std::span<const specula::index_t>) {}
  void prefill(specula::index_t, std::span<const specula::token_t>) {}
  specula::index_t context_size(specula::index_t) const { return 0; }
  void rollback(specula::index_t, specula::index_t) {}
};

int main() {
  all_requests_batch m;
  use_batched_model(m);
}
