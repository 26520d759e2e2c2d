// The class-consistency proxy of scripts/distortion.py: an image model's own conditional
// log-likelihoods of a sampled image under every class label, log p(x | c) for c = 0..C-1, from
// which Bayes with a uniform prior gives log p(c | x) = log p(x | c) - logsumexp_c' log p(x | c').
//
//   specula_example_image_label_score --stdin [--model NAME] [--threads N] [--batch B] < images
//
// Input (--stdin): one image per line, its grid*grid image tokens (row-major) separated by blanks.
// Output: one line per image, the C log-likelihoods (nats) in class order. Each is the sum over
// the image's tokens of log softmax(logits restricted to the image tokens)[token], the law that
// specula_demo samples at temperature 1 without guidance or filters (label tokens are never
// sampled as image tokens). The sequences [label, image tokens] of a batch are evaluated in one
// call of the backend (causal, no cache), B images (times C labels) per call.
//
// Without --stdin (the ctest run) it scores the model's first 40 held-out images (their own
// labels kept) and fails unless the Bayes classifier recovers the true label of at least half
// of them (chance: 1 in 8; it recovers 30 of these 40, 76 of all 100 held-out images of
// image-ar-256 and 158 of image-ar's 200: the classes share backgrounds, which dominate the
// likelihood).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <specula_example/safetensors.hpp>
#include <specula_example/transformer.hpp>
#include <specula_example/vq_image.hpp>

namespace {

namespace ex = specula::example;
using specula::index_t;
using specula::token_t;

struct options {
  std::string model = "image-ar-256";
  index_t threads = 1;
  index_t batch = 8;
  bool read_stdin = false;
};

/// log p(x | c) for every image of `images` (each tokens_per_image tokens) and class c.
std::vector<double> score(const ex::transformer& m, const ex::vq_codebook& vq,
                          const std::vector<token_t>& images, index_t batch) {
  const index_t n = vq.tokens_per_image(), T = n + 1, V = m.vocab_size(), codes = vq.codes();
  const auto C = static_cast<index_t>(vq.classes().size());
  const auto count = static_cast<index_t>(images.size()) / n;
  std::vector<double> out(static_cast<std::size_t>(count * C));
  std::vector<token_t> seqs;
  std::vector<float> logits;
  for (index_t i0 = 0; i0 < count; i0 += batch) {
    const index_t b = std::min(batch, count - i0);
    seqs.assign(static_cast<std::size_t>(b * C * T), 0);
    for (index_t i = 0; i < b; ++i)
      for (index_t c = 0; c < C; ++c) {
        token_t* s = seqs.data() + (i * C + c) * T;
        s[0] = vq.label_token(c);
        std::copy_n(images.data() + (i0 + i) * n, n, s + 1);
      }
    logits.resize(static_cast<std::size_t>(b * C * T * V));
    m.evaluate_sequences(seqs, T, specula::batch_view<float>(logits.data(), b * C * T, V));
    for (index_t i = 0; i < b; ++i)
      for (index_t c = 0; c < C; ++c) {
        double ll = 0.0;
        const token_t* s = seqs.data() + (i * C + c) * T;
        for (index_t t = 0; t < n; ++t) {  // row t predicts token t + 1 (image token t)
          const float* row = logits.data() + ((i * C + c) * T + t) * V;
          const double mx = *std::max_element(row, row + codes);
          double z = 0.0;
          for (index_t v = 0; v < codes; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
          ll += static_cast<double>(row[s[t + 1]]) - mx - std::log(z);
        }
        out[static_cast<std::size_t>((i0 + i) * C + c)] = ll;
      }
  }
  return out;
}

index_t parse_index(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  const long long x = std::stoll(v, &used);
  if (used != v.size()) throw std::invalid_argument(flag + ": not an integer: " + v);
  return static_cast<index_t>(x);
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--stdin") {
      o.read_stdin = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + ": missing value (or unknown flag)");
    const std::string value = argv[++i];
    if (flag == "--model")
      o.model = value;
    else if (flag == "--threads")
      o.threads = parse_index(flag, value);
    else if (flag == "--batch")
      o.batch = parse_index(flag, value);
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  if (o.model != "image-ar-256" && o.model != "image-ar")
    throw std::invalid_argument("--model: image-ar-256 or image-ar");
  if (o.batch < 1 || o.batch > 256) throw std::invalid_argument("--batch: must be in [1, 256]");
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const ex::transformer m =
      ex::transformer::load(dir / (o.model + ".safetensors"),
                            ex::backend_options{ex::transformer::default_kernel(),
                                                ex::best_cpu_isa(), static_cast<int>(o.threads)});
  const ex::vq_codebook vq =
      ex::vq_codebook::load(dir / "image-vq.safetensors", dir / (o.model + ".safetensors"));
  const index_t n = vq.tokens_per_image();
  const auto C = static_cast<index_t>(vq.classes().size());

  std::vector<token_t> images;
  std::vector<index_t> labels;  // self-test: the held-out labels
  bool have_input = false;
  if (o.read_stdin) {
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::vector<token_t> row;
      long long t = 0;
      while (in >> t) row.push_back(static_cast<token_t>(t));
      if (row.empty()) continue;
      if (static_cast<index_t>(row.size()) != n)
        throw std::invalid_argument("an input line has " + std::to_string(row.size()) +
                                    " tokens, not " + std::to_string(n));
      for (const token_t x : row)
        if (x < 0 || x >= vq.codes())
          throw std::invalid_argument("token " + std::to_string(x) + " is not an image token");
      images.insert(images.end(), row.begin(), row.end());
      have_input = true;
    }
  }
  if (o.read_stdin && !have_input) throw std::invalid_argument("--stdin: no image read");
  if (!o.read_stdin) {  // the self-test on the held-out images
    const auto data = ex::safetensors_file::open(dir / (o.model + ".heldout.safetensors"));
    const auto inputs = data.read_i32("inputs");
    const index_t T = data.at("inputs").shape[1];
    const index_t rows = data.at("inputs").shape[0];
    if (T != n + 1) throw std::runtime_error("held-out rows are not [label, image] sequences");
    for (index_t r = 0; r < std::min<index_t>(rows, 40); ++r) {
      const token_t label = inputs[static_cast<std::size_t>(r * T)];
      index_t c = 0;
      while (c < C && vq.label_token(c) != label) ++c;
      if (c == C) continue;  // a null-label row
      labels.push_back(c);
      images.insert(images.end(), inputs.begin() + r * T + 1, inputs.begin() + (r + 1) * T);
    }
  }
  const std::vector<double> ll = score(m, vq, images, o.batch);
  if (o.read_stdin) {
    for (std::size_t i = 0; i < ll.size(); i += static_cast<std::size_t>(C)) {
      for (index_t c = 0; c < C; ++c)
        std::printf(c + 1 < C ? "%.6f " : "%.6f\n", ll[i + static_cast<std::size_t>(c)]);
    }
    return 0;
  }
  index_t correct = 0;
  double mean_log_post = 0.0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double* row = ll.data() + i * static_cast<std::size_t>(C);
    const double mx = *std::max_element(row, row + C);
    double z = 0.0;
    for (index_t c = 0; c < C; ++c) z += std::exp(row[c] - mx);
    mean_log_post += row[labels[i]] - mx - std::log(z);
    correct += (std::max_element(row, row + C) - row) == labels[i] ? 1 : 0;
  }
  const auto k = static_cast<index_t>(labels.size());
  std::printf(
      "%s: %lld held-out images, Bayes label accuracy %lld/%lld, mean log p(label | x) %.4f\n",
      o.model.c_str(), static_cast<long long>(k), static_cast<long long>(correct),
      static_cast<long long>(k), mean_log_post / static_cast<double>(k));
  return 2 * correct >= k && k > 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "specula_example_image_label_score: %s\n", e.what());
  return 2;
}
