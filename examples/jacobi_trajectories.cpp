// Jacobi Forcing trajectory collection (paper §2.2 and Appendix C; the released trajectory
// generator): greedy Jacobi decoding in block mode over a prompt set, every iteration's block
// state recorded through jacobi_options::on_iteration, written to a safetensors file that the
// data preparation (specula/decode/jacobi_forcing.hpp) and a trainer read.
//
//   specula_example_jacobi_trajectories [--out FILE] [--model NAME] [--block-size N]
//                                       [--max-new-tokens N] [--prompts K] [--prompt-bytes P]
//                                       [--seed S] [--prompts-file FILE] [--model-file PATH]
//
// Prompts: the first P bytes of K held-out windows of <model>.heldout (every rows/K-th window),
// or, with --prompts-file, K windows of P bytes at evenly spaced offsets of FILE (a byte-level
// model's training text: tools/train_models.py collects Jacobi Forcing trajectories this way).
// --model-file loads the weights from PATH instead of examples/models/<model>.safetensors (the
// trainer's second round collects with its first-round model).
// Without --out the program runs a small collection into a temporary file, reads it back and
// checks it (the ctest run): every converged block's fixed point is the greedy output at its
// positions, the last point of its trajectory equals it, and the blocks tile the output.
//
// File layout (all I32; B converged blocks, T trajectory points, n = block size):
//   prompt_tokens [sum of prompt lengths], prompt_offsets [K + 1]
//   output_tokens [sum of output lengths], output_offsets [K + 1]   (the greedy outputs)
//   block_prompt [B]       the prompt index of each block
//   block_position [B]     output position of the block's first token (its root; -1: the last
//                          prompt token)
//   fixed_points [B, n]    each block's fixed point
//   point_offsets [B + 1]  block b's trajectory is points [point_offsets[b], point_offsets[b+1])
//   points [T, n]          trajectory points: converged prefix (root included), then guesses
//   point_converged [T]    leading tokens of each point already final
// Metadata: model, block_size, max_new_tokens, init ("sample_context"), seed.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <specula/decode/jacobi.hpp>
#include <specula_example/safetensors.hpp>
#include <specula_example/sessions.hpp>

namespace {

namespace ex = specula::example;
using specula::index_t;
using specula::token_t;

struct options {
  std::filesystem::path out;
  std::string model = "text-target";
  index_t block_size = 16;
  index_t max_new_tokens = 64;
  index_t prompts = 8;
  index_t prompt_bytes = 64;
  std::uint64_t seed = 1;
  std::filesystem::path prompts_file;  // empty: held-out windows of <model>.heldout
  std::filesystem::path model_file;    // empty: examples/models/<model>.safetensors
};

/// K prompts of P tokens: the held-out windows of <model>.heldout, or byte windows of a file.
std::vector<std::vector<token_t>> load_prompts(const options& o) {
  std::vector<std::vector<token_t>> prompts;
  if (!o.prompts_file.empty()) {
    std::ifstream in(o.prompts_file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + o.prompts_file.string());
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto length = static_cast<index_t>(bytes.size());
    if (length < o.prompt_bytes)
      throw std::runtime_error(o.prompts_file.string() + ": shorter than --prompt-bytes");
    const index_t span = length - o.prompt_bytes;
    for (index_t i = 0; i < o.prompts; ++i) {
      const index_t start = o.prompts == 1 ? 0 : i * span / (o.prompts - 1);
      std::vector<token_t> prompt;
      for (index_t t = 0; t < o.prompt_bytes; ++t)
        prompt.push_back(static_cast<unsigned char>(bytes[static_cast<std::size_t>(start + t)]));
      prompts.push_back(std::move(prompt));
    }
    return prompts;
  }
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto held = ex::safetensors_file::open(dir / (o.model + ".heldout.safetensors"));
  const auto& info = held.at("inputs");
  const index_t rows = info.shape[0], T = info.shape[1];
  const auto inputs = held.read_i32("inputs", info.shape);
  const index_t count = std::min(o.prompts, rows);
  const index_t P = std::min(o.prompt_bytes, T);
  for (index_t i = 0; i < count; ++i) {
    const index_t r = i * (rows / count);
    std::vector<token_t> prompt;
    for (index_t t = 0; t < P; ++t) prompt.push_back(inputs[static_cast<std::size_t>(r * T + t)]);
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

/// What one collection produced (the tensors of the file, as vectors).
struct collection {
  std::vector<std::int32_t> prompt_tokens, prompt_offsets{0}, output_tokens, output_offsets{0};
  std::vector<std::int32_t> block_prompt, block_position, fixed_points, point_offsets{0}, points,
      point_converged;
};

collection collect(const options& o) {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model =
      ex::transformer::load(o.model_file.empty() ? dir / (o.model + ".safetensors") : o.model_file);
  const auto prompts = load_prompts(o);
  const auto count = static_cast<index_t>(prompts.size());

  collection c;
  ex::transformer_session s(model);
  std::vector<token_t> pending;  // the current block's points, n tokens each
  std::vector<std::int32_t> pending_converged;
  for (index_t i = 0; i < count; ++i) {
    const auto& prompt = prompts[static_cast<std::size_t>(i)];
    specula::jacobi_options jo;
    jo.window = o.block_size;
    jo.max_new_tokens = o.max_new_tokens;
    jo.block_mode = true;
    jo.init = specula::jacobi_init::sample_context;
    pending.clear();
    pending_converged.clear();
    jo.on_iteration = [&](const specula::jacobi_iteration& it) {
      if (!it.fixed_point) {
        if (it.converged == 1) {  // a new block
          pending.clear();
          pending_converged.clear();
        }
        // Points shorter than a block (the output's end) are padded with their last token;
        // they never belong to a converged block.
        for (index_t j = 0; j < o.block_size; ++j)
          pending.push_back(it.state[static_cast<std::size_t>(
              std::min<index_t>(j, static_cast<index_t>(it.state.size()) - 1))]);
        pending_converged.push_back(static_cast<std::int32_t>(it.converged));
        return;
      }
      c.block_prompt.push_back(static_cast<std::int32_t>(i));
      c.block_position.push_back(static_cast<std::int32_t>(it.position));
      c.fixed_points.insert(c.fixed_points.end(), it.state.begin(), it.state.end());
      c.points.insert(c.points.end(), pending.begin(), pending.end());
      c.point_converged.insert(c.point_converged.end(), pending_converged.begin(),
                               pending_converged.end());
      c.point_offsets.push_back(static_cast<std::int32_t>(c.point_converged.size()));
    };
    const auto out = specula::jacobi_decode(s, prompt, jo, specula::request_rng{o.seed, 0, 0});
    c.prompt_tokens.insert(c.prompt_tokens.end(), prompt.begin(), prompt.end());
    c.prompt_offsets.push_back(static_cast<std::int32_t>(c.prompt_tokens.size()));
    c.output_tokens.insert(c.output_tokens.end(), out.begin(), out.end());
    c.output_offsets.push_back(static_cast<std::int32_t>(c.output_tokens.size()));
  }
  return c;
}

void save(const std::filesystem::path& path, const options& o, const collection& c) {
  const auto tensor = [](std::string name, std::vector<std::int64_t> shape,
                         const std::vector<std::int32_t>& v) {
    ex::tensor_to_write t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.type = ex::dtype::i32;
    t.ints = v;
    return t;
  };
  const auto size = [](const std::vector<std::int32_t>& v) {
    return static_cast<std::int64_t>(v.size());
  };
  const std::int64_t n = o.block_size;
  const std::vector<ex::tensor_to_write> tensors = {
      tensor("prompt_tokens", {size(c.prompt_tokens)}, c.prompt_tokens),
      tensor("prompt_offsets", {size(c.prompt_offsets)}, c.prompt_offsets),
      tensor("output_tokens", {size(c.output_tokens)}, c.output_tokens),
      tensor("output_offsets", {size(c.output_offsets)}, c.output_offsets),
      tensor("block_prompt", {size(c.block_prompt)}, c.block_prompt),
      tensor("block_position", {size(c.block_position)}, c.block_position),
      tensor("fixed_points", {size(c.block_prompt), n}, c.fixed_points),
      tensor("point_offsets", {size(c.point_offsets)}, c.point_offsets),
      tensor("points", {size(c.point_converged), n}, c.points),
      tensor("point_converged", {size(c.point_converged)}, c.point_converged)};
  const std::map<std::string, std::string> meta = {
      {"model", o.model_file.empty() ? o.model : o.model_file.filename().string()},
      {"block_size", std::to_string(o.block_size)},
      {"max_new_tokens", std::to_string(o.max_new_tokens)},
      {"init", "sample_context"},
      {"seed", std::to_string(o.seed)}};
  ex::save_safetensors(path, tensors, meta);
}

/// Reads the file back and checks it against the rules in the file comment.
int check(const std::filesystem::path& path, const options& o) {
  const auto f = ex::safetensors_file::open(path);
  const auto read = [&](const char* name) { return f.read_i32(name, f.at(name).shape); };
  const auto outputs = read("output_tokens"), output_offsets = read("output_offsets");
  const auto prompts = read("prompt_tokens"), prompt_offsets = read("prompt_offsets");
  const auto block_prompt = read("block_prompt"), block_position = read("block_position");
  const auto fixed = read("fixed_points"), point_offsets = read("point_offsets");
  const auto points = read("points");
  const auto n = static_cast<std::size_t>(o.block_size);
  int failures = 0;
  const auto fail = [&](const std::string& what) {
    if (++failures <= 5) std::printf("FAILED: %s\n", what.c_str());
  };
  for (std::size_t b = 0; b < block_prompt.size(); ++b) {
    const auto p = static_cast<std::size_t>(block_prompt[b]);
    const auto token_at = [&](std::int32_t pos) {
      return pos < 0 ? prompts[static_cast<std::size_t>(prompt_offsets[p + 1] - 1)]
                     : outputs[static_cast<std::size_t>(output_offsets[p] + pos)];
    };
    for (std::size_t j = 0; j < n; ++j)
      if (fixed[b * n + j] != token_at(block_position[b] + static_cast<std::int32_t>(j)))
        fail("block " + std::to_string(b) + ": fixed point differs from the greedy output");
    // Consecutive blocks of a prompt tile the output.
    if (b > 0 && block_prompt[b - 1] == block_prompt[b] &&
        block_position[b] != block_position[b - 1] + o.block_size)
      fail("block " + std::to_string(b) + ": does not follow the previous block");
    const auto last = static_cast<std::size_t>(point_offsets[b + 1] - 1);
    if (point_offsets[b + 1] <= point_offsets[b])
      fail("block " + std::to_string(b) + ": empty trajectory");
    else if (block_position[b] + o.block_size < output_offsets[p + 1] - output_offsets[p])
      for (std::size_t j = 0; j < n; ++j)
        if (points[last * n + j] != fixed[b * n + j])
          fail("block " + std::to_string(b) + ": the last point is not the fixed point");
  }
  std::printf(
      "%zu prompts, %zu converged blocks of %lld tokens, %zu trajectory points (%.2f per "
      "block)\n",
      prompt_offsets.size() - 1, block_prompt.size(), static_cast<long long>(o.block_size),
      points.size() / n,
      block_prompt.empty()
          ? 0.0
          : static_cast<double>(points.size() / n) / static_cast<double>(block_prompt.size()));
  if (block_prompt.empty()) fail("no converged block");
  if (failures == 0) std::printf("trajectories check out\n");
  return failures == 0 ? 0 : 1;
}

index_t parse(const char* flag, const char* v) {
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || x < 1) {
    std::fprintf(stderr, "%s: expected an integer >= 1, got '%s'\n", flag, v);
    std::exit(2);
  }
  return static_cast<index_t>(x);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: missing value (see the file comment for the options)\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (a == "--out")
      o.out = v;
    else if (a == "--model")
      o.model = v;
    else if (a == "--block-size")
      o.block_size = parse("--block-size", v);
    else if (a == "--max-new-tokens")
      o.max_new_tokens = parse("--max-new-tokens", v);
    else if (a == "--prompts")
      o.prompts = parse("--prompts", v);
    else if (a == "--prompt-bytes")
      o.prompt_bytes = parse("--prompt-bytes", v);
    else if (a == "--prompts-file")
      o.prompts_file = v;
    else if (a == "--model-file")
      o.model_file = v;
    else if (a == "--seed")
      o.seed = static_cast<std::uint64_t>(parse("--seed", v));
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  try {
    const bool quick = o.out.empty();
    if (quick) {
      o.out = std::filesystem::temp_directory_path() / "specula_jacobi_trajectories.safetensors";
      o.prompts = 3;
      o.block_size = 8;
      o.max_new_tokens = 40;
    }
    const auto c = collect(o);
    save(o.out, o, c);
    std::printf("wrote %s\n", o.out.string().c_str());
    const int rc = check(o.out, o);
    if (quick) std::filesystem::remove(o.out);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
