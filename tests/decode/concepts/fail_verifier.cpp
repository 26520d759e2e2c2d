// A verifier that cannot be called with the tree batch.
#include "concept_checks.hpp"

struct not_a_verifier {
  void operator()(int) const {}
};

int main() { use_verifier(not_a_verifier{}); }
