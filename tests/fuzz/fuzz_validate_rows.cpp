// libFuzzer target: input validation of probability rows and chain batches.
//
// The input bytes choose a vocabulary, a ragged batch (offsets, tokens) and raw float rows
// (any bit patterns: NaN, Inf, negative, denormal). The checked entry point must either throw
// specula::invalid_input or accept; accepted inputs are then verified and the outputs checked
// against the layout's invariants. Any crash, sanitizer report or failed invariant is a bug.

#include <cstdint>
#include <cstring>
#include <vector>

#include "specula/verify/chain.hpp"

namespace {

struct reader {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  template <class T>
  T take() {
    T v{};
    if (pos + sizeof(T) <= size) {
      std::memcpy(&v, data + pos, sizeof(T));
      pos += sizeof(T);
    } else {
      pos = size;
    }
    return v;
  }
};

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace specula;
  reader in{data, size};
  const index_t vocab = 1 + in.take<std::uint8_t>() % 32;
  const index_t batch = in.take<std::uint8_t>() % 5;  // 0 is a valid "no requests" case
  const bool one_hot = (in.take<std::uint8_t>() & 1) != 0;
  std::vector<index_t> offsets{0};
  for (index_t b = 0; b < batch; ++b)
    offsets.push_back(offsets.back() + in.take<std::uint8_t>() % 5);
  const index_t num_draft = offsets.back();
  std::vector<token_t> tokens(static_cast<std::size_t>(num_draft));
  for (auto& t : tokens) t = static_cast<token_t>(in.take<std::int8_t>());
  // Rows: mostly well-formed probability rows, with fuzzed entries spliced in.
  auto make_rows = [&](index_t rows) {
    std::vector<float> r(static_cast<std::size_t>(rows * vocab), 1.0f / static_cast<float>(vocab));
    for (auto& v : r)
      if (in.take<std::uint8_t>() % 4 == 0) v = in.take<float>();
    return r;
  };
  const auto target = make_rows(num_draft + batch);
  const auto draft = make_rows(num_draft);
  std::vector<request_rng> rng(static_cast<std::size_t>(batch),
                               request_rng{in.take<std::uint64_t>(), 0, 0});
  const double tolerance = in.take<std::uint8_t>() % 2 ? 1e-3 : 0.5;

  std::vector<token_t> out(static_cast<std::size_t>(num_draft + batch), 99);
  std::vector<std::int32_t> n(static_cast<std::size_t>(batch), -7);
  std::vector<std::uint32_t> flags(static_cast<std::size_t>(batch), 0);
  chain_batch_input<float> input;
  input.vocab_size = vocab;
  input.draft_offsets = offsets;
  input.draft_tokens = tokens;
  if (!one_hot) input.draft_probs = {draft.data(), num_draft, vocab};
  input.target_probs = {target.data(), num_draft + batch, vocab};
  input.rng = rng;
  chain_options options;
  options.sum_tolerance = tolerance;
  try {
    verify_chain(host::seq, input, chain_batch_output{out, n, {}, flags}, options);
  } catch (const invalid_input&) {
    return 0;
  }
  for (index_t b = 0; b < batch; ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const index_t len = offsets[sb + 1] - offsets[sb];
    require(n[sb] >= 0 && n[sb] <= len);
    const token_t last = out[static_cast<std::size_t>(offsets[sb] + b + n[sb])];
    require((flags[sb] & chain_valid) != 0);
    require(last >= 0 && last < vocab);
  }
  return 0;
}
