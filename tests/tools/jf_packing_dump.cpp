// The C++ side of the ctest tools.jf_packing_matches_cpp (tests/tools/check_jf_packing.py):
// reads requests from stdin and prints what specula/decode/jacobi_forcing.hpp computes for
// them, for comparison with the trainer's plain-Python packing (tools/jf_packing.py).
//
// Requests (whitespace-separated integers and words):
//   pack P N n KIND WINDOW  prompt[P] clean[N*n] noisy[N*n]   KIND: nc | cllm | nc_ic
//     -> "positions ..." (position_ids), "tokens ..." (pack_tokens), then the attention mask,
//        one row of '0'/'1' per slot (bit j of row i: slot i attends to slot j)
//   select n K RATIO  trajectory[K*n] fixed[n]
//     -> "select I": select_noisy_view with jacobi_noise_options::released() and ratio RATIO
//   ratio B n W
//     -> "ratio R": jacobi_noise_for(B, n, W, released()).ratio printed with 17 digits

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <specula/decode/jacobi_forcing.hpp>

namespace {

using specula::index_t;
using specula::token_t;

std::vector<token_t> read_tokens(index_t count) {
  std::vector<token_t> v(static_cast<std::size_t>(count));
  for (auto& t : v)
    if (!(std::cin >> t)) throw std::runtime_error("stdin: too few tokens");
  return v;
}

specula::jacobi_mask_kind mask_kind(const std::string& name) {
  if (name == "nc") return specula::jacobi_mask_kind::noise_conditioned;
  if (name == "cllm") return specula::jacobi_mask_kind::clean_conditioned;
  if (name == "nc_ic") return specula::jacobi_mask_kind::noise_conditioned_intra_window_clean;
  throw std::runtime_error("unknown mask kind '" + name + "'");
}

void pack() {
  index_t P = 0, N = 0, n = 0, window = 0;
  std::string kind;
  std::cin >> P >> N >> n >> kind >> window;
  const specula::jacobi_packing pk(P, N, n);
  const auto prompt = read_tokens(P), clean = read_tokens(N * n), noisy = read_tokens(N * n);
  std::string line = "positions";
  for (const index_t p : pk.position_ids()) line.append(" ").append(std::to_string(p));
  std::puts(line.c_str());
  line = "tokens";
  for (const token_t t : pk.pack_tokens(prompt, clean, noisy))
    line.append(" ").append(std::to_string(t));
  std::puts(line.c_str());
  const auto mask = pk.attention_mask(mask_kind(kind), window);
  const index_t words = pk.mask_words();
  for (index_t i = 0; i < pk.size(); ++i) {
    line.assign(static_cast<std::size_t>(pk.size()), '0');
    for (index_t j = 0; j < pk.size(); ++j)
      if ((mask[static_cast<std::size_t>(i * words + j / 64)] >> (j % 64)) & 1U)
        line[static_cast<std::size_t>(j)] = '1';
    std::puts(line.c_str());
  }
}

void select() {
  index_t n = 0, K = 0;
  double ratio = 0.0;
  std::cin >> n >> K >> ratio;
  const auto trajectory = read_tokens(K * n), fixed = read_tokens(n);
  specula::jacobi_noise_target target;
  target.ratio = ratio;
  std::printf("select %lld\n",
              static_cast<long long>(specula::select_noisy_view(
                  trajectory, fixed, target, specula::jacobi_noise_options::released())));
}

void ratio() {
  index_t b = 0, n = 0, w = 0;
  std::cin >> b >> n >> w;
  std::printf("ratio %.17g\n",
              specula::jacobi_noise_for(b, n, w, specula::jacobi_noise_options::released()).ratio);
}

}  // namespace

int main() {
  try {
    std::string request;
    while (std::cin >> request) {
      if (request == "pack")
        pack();
      else if (request == "select")
        select();
      else if (request == "ratio")
        ratio();
      else
        throw std::runtime_error("unknown request '" + request + "'");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
