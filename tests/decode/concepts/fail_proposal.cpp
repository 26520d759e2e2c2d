// A proposal whose propose() returns nothing convertible to bool.
#include "concept_checks.hpp"

struct proposal_returns_void {
  void propose(std::span<const specula::token_t>, specula::token_tree&, std::vector<float>&) {}
};

int main() {
  proposal_returns_void p;
  use_proposal(p);
}
