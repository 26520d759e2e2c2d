// A model whose evaluate() takes the wrong arguments.
#include "concept_checks.hpp"

struct model_wrong_evaluate {
  specula::index_t vocab_size() const { return 4; }
  void evaluate(int) {}
  void commit(std::span<const specula::index_t>) {}
};

int main() {
  model_wrong_evaluate m;
  use_model(m);
}
