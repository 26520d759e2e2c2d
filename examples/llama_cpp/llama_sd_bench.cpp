// specula's speculative decoding over llama.cpp against plain llama.cpp decoding, in one process,
// same context settings (llama_model_options: F32 cache, flash attention off) and threads:
//
//   specula_llama_sd_bench [--target GGUF] [--draft GGUF] [--prompt TEXT] [--n N]
//                          [--draft-length K] [--tree WxD] [--threads T] [--repeat R]
//                          [--cost-curve]
//
// Greedy decoding both ways (greedy drafts, greedy verification: lossless, so the outputs must
// be equal). Prints tokens per CPU second of each (best of R runs, process CPU time: with one
// thread, what a quiet machine's wall clock would show; prefill included: one llama_decode of
// the prompt), the same for generation only (a run of N tokens minus a run of 1, as the script
// measures llama-speculative), the SD loop's acceptance, llama_decode calls and whether the
// outputs agree. --cost-curve also prints the target's pass cost c(n) for chains of n nodes.
// scripts/llama_cpp_bench.sh runs it next to llama.cpp's own llama-speculative.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <llama_model.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/tree/builders.hpp>

namespace {

using namespace specula;
namespace ex = specula::example;

std::vector<token_t> plain_greedy(ex::llama_model& m, std::span<const token_t> prompt, index_t n) {
  m.prefill(prompt);
  const index_t V = m.vocab_size();
  std::vector<float> row(static_cast<std::size_t>(V));
  std::vector<token_t> out;
  token_t last = prompt.back();
  const std::vector<index_t> root{0};
  for (index_t i = 0; i < n; ++i) {
    const token_tree one(std::vector<index_t>{-1}, std::vector<token_t>{last});
    m.evaluate(one, batch_view<float>(row.data(), 1, V));
    m.commit(root);
    last = static_cast<token_t>(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(last);
  }
  return out;
}

/// Best of `repeat` runs of f, in process CPU seconds (one thread: robust to other jobs taking
/// the cores, which wall time on a shared machine is not).
template <class F>
double best_seconds(int repeat, F&& f) {
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const std::clock_t t0 = std::clock();
    f();
    best = std::min(best, static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC);
  }
  return best;
}

/// c(n) of the target over llama.cpp: the fastest of `repeat` x 10 evaluations of an n-node
/// chain after the prompt (evaluate, then roll the tree back), n = 1 .. 16, in microseconds.
void cost_curve(ex::llama_model& m, std::span<const token_t> prompt, int repeat) {
  m.prefill(prompt);
  const index_t V = m.vocab_size();
  std::printf("c(n) of the target over llama.cpp (fastest pass, us):");
  double c1 = 0.0;
  for (index_t n : {1, 2, 3, 4, 5, 7, 9, 16}) {
    std::vector<index_t> parents(static_cast<std::size_t>(n));
    std::vector<token_t> tokens(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      parents[static_cast<std::size_t>(i)] = i - 1;
      tokens[static_cast<std::size_t>(i)] = prompt[static_cast<std::size_t>(i) % prompt.size()];
    }
    const token_tree chain(parents, tokens);
    std::vector<float> rows(static_cast<std::size_t>(n * V));
    double best = 1e300;
    for (int r = 0; r < 10 * repeat; ++r) {
      const std::clock_t t0 = std::clock();
      m.evaluate(chain, batch_view<float>(rows.data(), n, V));
      best = std::min(best, static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC);
    }
    if (n == 1) c1 = best;
    std::printf(" c(%d) %.0f (%.2f)", static_cast<int>(n), 1e6 * best, best / c1);
  }
  std::printf("\n");
  m.rollback(0);
}

std::string printable(const std::vector<token_t>& t) {
  std::string s;
  for (const token_t c : t) s += (c >= 32 && c < 127) || c == '\n' ? static_cast<char>(c) : '?';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string target_path = SPECULA_GGUF_DIR "/text-target.gguf";
  std::string draft_path = SPECULA_GGUF_DIR "/text-draft.gguf";
  std::string prompt_text = "class Parser:\n    def __init__(self";
  index_t n = 128, k = 4, tree_w = 0, tree_d = 0;
  int threads = 1, repeat = 3;
  index_t max_leaves = 0;
  bool cost = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--target")
      target_path = next();
    else if (a == "--draft")
      draft_path = next();
    else if (a == "--prompt")
      prompt_text = next();
    else if (a == "--n")
      n = std::stoi(next());
    else if (a == "--draft-length")
      k = std::stoi(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--repeat")
      repeat = std::stoi(next());
    else if (a == "--cost-curve")
      cost = true;
    else if (a == "--max-leaves")
      max_leaves = std::stoi(next());
    else if (a == "--tree") {
      const std::string v = next();
      const auto x = v.find('x');
      if (x == std::string::npos) {
        std::fprintf(stderr, "--tree: expected WxD\n");
        return 2;
      }
      tree_w = std::stoi(v.substr(0, x));
      tree_d = std::stoi(v.substr(x + 1));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  example::llama_model_options opt;
  opt.threads = threads;
  if (max_leaves > 0) opt.max_leaves = max_leaves;
  ex::llama_model target(target_path, opt), draft(draft_path, opt), plain(target_path, opt);
  const std::vector<token_t> prompt(prompt_text.begin(), prompt_text.end());

  std::vector<token_t> ref, ref1;
  speculative_options sd;
  sd.mode = draft_mode::greedy;
  sd.draft_length = k;
  if (tree_w > 0) sd.draft_tree = trees::full(tree_w, tree_d);
  std::vector<token_t> out, out1;
  decode_stats st;
  const auto run_sd = [&](index_t tokens, std::vector<token_t>& o) {
    sd.max_new_tokens = tokens;
    st = {};
    o = speculative_decode(target, draft, prompt, sd, request_rng{1, 0, 0},
                           greedy_tree_verifier<>{}, &st);
  };
  // Generation only, as scripts/llama_cpp_bench.sh measures llama.cpp's llama-speculative: the
  // best time of a run of n tokens minus that of a run of 1 token (the prefills and the first
  // step cancel).
  const double t_plain = best_seconds(repeat, [&] { ref = plain_greedy(plain, prompt, n); });
  const double t_plain1 = best_seconds(repeat, [&] { ref1 = plain_greedy(plain, prompt, 1); });
  const double t_sd1 = best_seconds(repeat, [&] { run_sd(1, out1); });
  const auto c0 = target.decode_calls(), d0 = draft.decode_calls();
  const double t_sd = best_seconds(repeat, [&] { run_sd(n, out); });
  const double runs = repeat;
  const double gen_plain = (n - 1) / (t_plain - t_plain1), gen_sd = (n - 1) / (t_sd - t_sd1);
  std::printf("target %s, draft %s, %d thread(s), %d new tokens, prompt %zu tokens\n",
              target_path.c_str(), draft_path.c_str(), threads, static_cast<int>(n), prompt.size());
  std::printf("llama.cpp's CPU matrix products of 2+ tokens: %s\n",
              ex::llama_uses_llamafile() ? "llamafile's tinyBLAS (GGML_LLAMAFILE=ON)"
                                         : "ggml's dot products (GGML_LLAMAFILE=OFF)");
  std::printf(
      "plain llama.cpp greedy:   %8.1f tokens/s  (%d llama_decode calls; generation only: "
      "%.1f tokens per CPU second)\n",
      n / t_plain, static_cast<int>(n + 1), gen_plain);
  std::printf(
      "specula SD over llama.cpp:%8.1f tokens/s  (%s; %.2f tokens/step, target %.0f + "
      "draft %.0f llama_decode calls)  speed-up %.2fx; generation only: %.1f tokens per CPU "
      "second, speed-up %.2fx\n",
      n / t_sd,
      tree_w > 0 ? ("tree " + std::to_string(tree_w) + "x" + std::to_string(tree_d)).c_str()
                 : ("chain k=" + std::to_string(k)).c_str(),
      st.step_compression(), static_cast<double>(target.decode_calls() - c0) / runs,
      static_cast<double>(draft.decode_calls() - d0) / runs, t_plain / t_sd, gen_sd,
      gen_plain > 0 ? gen_sd / gen_plain : 0.0);
  std::printf("SD time split (last run, wall ms): target %.1f, draft %.1f, verify %.1f\n",
              1e3 * st.forward_seconds, 1e3 * st.draft_seconds, 1e3 * st.verify_seconds);
  if (cost) cost_curve(plain, prompt, repeat);
  std::printf("outputs equal: %s\n", out == ref ? "yes" : "NO");
  std::printf("text: %s\n", printable(out).c_str());
  return out == ref ? 0 : 1;
}
