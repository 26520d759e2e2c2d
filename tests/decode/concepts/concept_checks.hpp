#pragma once
// Constrained entry points used by the concept compile tests (the decoding loops constrain
// their parameters the same way).
#include "specula/decode/concepts.hpp"

template <specula::model M>
void use_model(M& m) {
  (void)m;
}
template <specula::proposal P>
void use_proposal(P& p) {
  (void)p;
}
template <specula::verifier V>
void use_verifier(const V& v) {
  (void)v;
}
template <specula::batched_session_model M>
void use_batched_model(M& m) {
  (void)m;
}
