// A model without commit(): must not compile, and the error must name the missing requirement.
#include "concept_checks.hpp"

struct model_without_commit {
  specula::index_t vocab_size() const { return 4; }
  void evaluate(const specula::token_tree&, specula::batch_view<float>) {}
};

int main() {
  model_without_commit m;
  use_model(m);
}
