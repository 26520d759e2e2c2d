// The C++ side of the Python package's bit-for-bit test (python/tests/test_cpp_reference.py):
// reads a padded chain batch written by the test, verifies it with specula::verify_chain
// (host::seq, exact rule, default options) and writes the outputs, or the message of the
// invalid_input it threw.
//
//   specula_py_reference <input> <output>
//
// input:  int64 B, L, V, has_draft_probs; [float32 draft_probs B*L*V]; int32 drafts B*L;
//         float32 target_probs B*(L+1)*V; uint64 seeds B; uint32 request_ids B; uint32 steps B
// output: int32 0, then int32 output_tokens B*(L+1), int32 num_accepted B, uint32 flags B;
//         or int32 1, then the error message

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include "specula/verify.hpp"

namespace {

template <class T>
std::vector<T> read_values(std::ifstream& in, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  return v;
}

template <class T>
void write_values(std::ofstream& out, const std::vector<T>& v) {
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(T)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: specula_py_reference <input> <output>\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const auto header = read_values<std::int64_t>(in, 4);
  const std::int64_t batch = header[0];
  const std::int64_t len = header[1];
  const std::int64_t vocab = header[2];
  const auto draft_probs =
      header[3] != 0 ? read_values<float>(in, batch * len * vocab) : std::vector<float>{};
  const auto drafts = read_values<specula::token_t>(in, batch * len);
  const auto target_probs = read_values<float>(in, batch * (len + 1) * vocab);
  const auto seeds = read_values<std::uint64_t>(in, batch);
  const auto ids = read_values<std::uint32_t>(in, batch);
  const auto steps = read_values<std::uint32_t>(in, batch);
  if (!in) {
    std::cerr << "specula_py_reference: short input\n";
    return 2;
  }
  std::vector<specula::request_rng> rng;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto i = static_cast<std::size_t>(b);
    rng.push_back({seeds[i], ids[i], steps[i]});
  }
  std::vector<specula::token_t> tokens(static_cast<std::size_t>(batch * (len + 1)));
  std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
  std::vector<std::uint32_t> flags(static_cast<std::size_t>(batch));
  const specula::padded_chain_input<float> input{
      vocab,
      batch,
      len,
      drafts,
      {},
      {draft_probs.data(), header[3] != 0 ? batch * len : 0, vocab},
      {target_probs.data(), batch * (len + 1), vocab},
      rng};
  std::ofstream out(argv[2], std::ios::binary);
  try {
    specula::verify_chain(specula::host::seq, input,
                          specula::padded_chain_output{tokens, accepted, {}, flags});
  } catch (const specula::invalid_input& e) {
    write_values(out, std::vector<std::int32_t>{1});
    out << e.what();
    return 0;
  }
  write_values(out, std::vector<std::int32_t>{0});
  write_values(out, tokens);
  write_values(out, accepted);
  write_values(out, flags);
  return 0;
}
