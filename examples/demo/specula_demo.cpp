// specula_demo: every decoding method of specula on the shipped tiny models, with statistics.
//
//   specula_demo --task text|image|diffusion --method ar|sd|lookup|sjd|sjd-pac|cool-sd|lantern|
//                jacobi|multiblock|ssd [options]        (specula_demo --help lists the options)
//
// Text: byte-level Python continuation of --prompt by text-target (draft: text-draft), or with
// --model text-target-jf by text-target fine-tuned with Jacobi Forcing (docs/jacobi_forcing.md),
// or with --model text-target-xl by the 18 M-parameter target whose weights stream from DRAM
// (drafts: text-draft or, --draft-model text-target, text-target).
// Image: 256 VQ tokens (16x16 grid of a 64x64 image) after a class label token, by image-ar-256
// (draft: image-draft; --image-model image-ar: 64 tokens, 8x8, 32x32, no draft model); LANTERN++
// relaxes acceptance to the drafted token's nearest codebook vectors; each sample is decoded with
// the VQ codebook (image-vq, in the model's layout) to <out-dir>/<method>_<i>.png, and its
// acceptance heat map (tokens emitted by the step that produced each cell) to
// <out-dir>/<method>_<i>_heat.png.
// Diffusion: text-diffusion (masked diffusion) with SSD and a stepwise baseline (hooks below).
//
// Exit codes: 0 success, 1 runtime error (models, files), 2 bad arguments, 3 the method is not
// available yet for the task.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/decode/cfg.hpp"
#include "specula/decode/jacobi.hpp"
#include "specula/decode/lookup.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula/decode/sjd.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/ssd.hpp"
#include "specula/decode/stats.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/rules/neighbour_table.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/testing/sjd_variants.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/chain.hpp"
#include "specula_example/sessions.hpp"
#include "specula_example/transformer.hpp"
#include "specula_example/vq_image.hpp"
#ifdef SPECULA_DEMO_CUDA
#include "specula_example/device_resident_sd.hpp"
#include "specula_example/device_resident_sjd.hpp"
#include "specula_example/device_transformer.hpp"
#include "specula_example/resident_ssd.hpp"
#endif
#include "specula_example/resident_greedy.hpp"

#include "heatmap.hpp"
#include "png_writer.hpp"

#if defined(SPECULA_DEMO_LLAMA_CPP)
#include <llama_model.hpp>
#endif

namespace {

namespace ex = specula::example;

#ifdef SPECULA_DEMO_CUDA
using device_model = ex::device_transformer;
#else
struct device_model {};  // without CUDA, --device cuda is refused
#endif
using json = nlohmann::ordered_json;
using specula::decode_stats;
using specula::index_t;
using specula::token_t;

constexpr int exit_runtime_error = 1;
constexpr int exit_bad_arguments = 2;
constexpr int exit_not_available = 3;

/// A bad command line (exit code 2); the message names the argument.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A method that is not wired in yet for the task (exit code 3).
class not_available : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

enum class task_kind : unsigned { text = 1u, image = 2u, diffusion = 4u };

constexpr unsigned mask_of(task_kind t) { return static_cast<unsigned>(t); }

const char* task_name(task_kind t) {
  switch (t) {
    case task_kind::text:
      return "text";
    case task_kind::image:
      return "image";
    case task_kind::diffusion:
      return "diffusion";
  }
  return "?";
}

constexpr const char* default_prompt =
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        ";
/// Shorter, so that prompt + 64 tokens fit text-diffusion's 128 positions.
constexpr const char* default_diffusion_prompt =
    "class Stack:\n    def push(self, item):\n        ";

struct demo_options {
  task_kind task = task_kind::text;
  std::string method;
  // sampling (target rows; the draft uses the same transform)
  double temperature = 1.0;
  index_t top_k = 0;
  double top_p = 1.0;
  double cfg = 1.0;  // image: classifier-free guidance scale (1: off)
  bool greedy = false;
  bool draft_greedy = false;
  std::uint64_t seed = 1;
  index_t max_new_tokens = -1;  // -1: the task's default
  std::string prompt = default_prompt;
  std::string label = "0";                   // image class: index, name, or -1 (null label)
  std::string image_model = "image-ar-256";  // image task: the model (its grid from its metadata)
  std::string text_model = "text-target";    // text task: the target model
  std::string draft_model;                   // sd / cool-sd draft (empty: the task's default)
  index_t num_samples = 1;
  index_t warmup = 0;          // untimed samples decoded before the timed ones
  index_t threads = 1;         // backend threads of every model (0: one per hardware thread)
  std::string device = "cpu";  // cpu (the example backend) | cuda (device_transformer)
  bool no_resident = false;    // --device cuda: every loop through device_session
  std::filesystem::path models_dir = SPECULA_MODELS_DIR;
  std::string backend = "specula";  // --backend: specula (the example backend) or llama.cpp
#if defined(SPECULA_DEMO_LLAMA_CPP)
  std::filesystem::path gguf_dir = SPECULA_GGUF_DIR;  // --gguf-dir: tools/to_gguf.py's output
#else
  std::filesystem::path gguf_dir;
#endif
  std::filesystem::path out_dir = "specula_demo_out";
  index_t scale = 8;
  bool json_output = false;
  bool quiet = false;
  // sd / cool-sd
  index_t draft_length = 4;
  double p_min = 0.0;            // sd: dynamic draft length (speculative_options::draft_p_min)
  index_t lookup_branches = 1;   // lookup: n-gram continuations per step (1: a chain)
  index_t lookup_ngram = 3;      // lookup: longest context suffix looked up
  index_t draft_tree_width = 0;  // --draft-tree WxD: full W-ary draft tree of D levels (0: chain)
  index_t draft_tree_depth = 0;
  bool draft_tree_lantern = false;  // --draft-tree lantern: LANTERN's static naive_extend_57
  bool draft_tree_path = false;     // --draft-tree WxD/path: W siblings per level on the first path
  std::string cool_schedule = "uniform";
  double delta = 2.0;
  double nu = 0.7;
  double ell = 8.0;
  std::string resampling = "optimal";
  // lantern (image): LANTERN++ with the paper's cap lambda * p(x)
  double lambda = 1.0;
  index_t lantern_k = 10;
  // sjd / sjd-pac / jacobi
  index_t window = -1;  // -1: the method's default
  std::string init;     // empty: the method's default
  index_t pd_width = 4;
  index_t pd_depth = 3;
  int count_root = -1;  // --count-root / --no-count-root; -1: the method's default
  bool pd_first_path = false;
  bool no_ac = false;
  bool no_pd = false;
  // multiblock / ssd / diffusion ar
  index_t block_size = -1;  // -1: the method's default (multiblock 64, diffusion 8)
  index_t blocks = 2;
  double spawn_ratio = 0.85;
  bool no_recycling = false;
  std::string sjd_variant = "exact";  // sjd-pac --sjd-variant (the authors' code's deviations)
  bool ra_only = false;     // multiblock --ra-only: verify within the RA block (released extent)
  bool stochastic = false;  // multiblock --stochastic: the sampled (lossless) variant
  index_t pool_size = 4;
  index_t ngram = 16;
  std::string pool = "fifo";
  std::string spawn = "newest";
  bool mix_order = false;
  // diffusion (ar, ssd): the dual cache (empty: the default, dual, the SSD paper's setting)
  std::string cache;
  index_t refresh = 8;
  bool fallback = false;

  std::vector<std::string> given;  // flags present on the command line, in order
  [[nodiscard]] bool has(std::string_view flag) const {
    return std::find(given.begin(), given.end(), flag) != given.end();
  }
};

// ---------------------------------------------------------------------------------------------
// Progress line
// ---------------------------------------------------------------------------------------------

/// `\r[specula_demo] 37/64 tokens, 12 steps` on stderr, updated at most every 50 ms, when
/// enabled (stderr a tty and no --quiet). The destructor ends the line.
class progress_line {
 public:
  explicit progress_line(bool enabled) : enabled_(enabled) {}
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  ~progress_line() { finish(); }

  void begin(index_t sample, index_t samples, index_t total) {
    sample_ = sample;
    samples_ = samples;
    total_ = total;
    tokens_ = 0;
    steps_ = 0;
    show(true);
  }
  /// One decoding step that committed `tokens` tokens.
  void advance(index_t tokens) {
    tokens_ += tokens;
    ++steps_;
    show(tokens_ >= total_);
  }
  void finish() {
    if (enabled_ && shown_) std::fputc('\n', stderr);
    shown_ = false;
  }

 private:
  void show(bool force) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && shown_ && now - last_ < std::chrono::milliseconds(50)) return;
    last_ = now;
    shown_ = true;
    if (samples_ > 1)
      std::fprintf(stderr, "\r\033[K[specula_demo] sample %lld/%lld: %lld/%lld tokens, %lld steps",
                   static_cast<long long>(sample_ + 1), static_cast<long long>(samples_),
                   static_cast<long long>(tokens_), static_cast<long long>(total_),
                   static_cast<long long>(steps_));
    else
      std::fprintf(stderr, "\r\033[K[specula_demo] %lld/%lld tokens, %lld steps",
                   static_cast<long long>(tokens_), static_cast<long long>(total_),
                   static_cast<long long>(steps_));
    std::fflush(stderr);
  }

  bool enabled_;
  bool shown_ = false;
  index_t sample_ = 0, samples_ = 1, total_ = 0, tokens_ = 0, steps_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

/// What one decoding run needs.
#if defined(SPECULA_DEMO_LLAMA_CPP)
using llama_session = ex::llama_model;
#else
/// Stands in for ex::llama_model in a build without llama.cpp (never constructed: --backend
/// llama.cpp is refused there).
struct llama_session {
  [[noreturn]] static void absent() { throw std::logic_error("built without llama.cpp"); }
  [[nodiscard]] index_t vocab_size() const { absent(); }
  [[nodiscard]] index_t context_size() const { absent(); }
  void prefill(std::span<const token_t>) { absent(); }
  void rollback(index_t) { absent(); }
  void evaluate(const specula::token_tree&, specula::batch_view<float>) { absent(); }
  void commit(std::span<const index_t>) { absent(); }
};
#endif

struct run_input {
  const demo_options& opt;
  const ex::transformer& model;      // the task's (target) model
  const ex::transformer* draft;      // text-draft or image-draft, for sd, cool-sd and lantern
  const device_model* device;        // --device cuda: the task's model on the GPU (else null)
  const device_model* device_draft;  // --device cuda: the draft model on the GPU
  const specula::neighbour_table* neighbours;  // lantern: codebook neighbours of every token
  std::span<const token_t> prompt;             // for image: the label token
  index_t vocab_limit;                         // tokens >= this are masked out of every row
  index_t image_width;                         // image task: tokens per image row (0: not an image)
  token_t null_label;        // image task: the null label token (-1: not an image)
  specula::request_rng rng;  // {seed, sample index, 0}
  progress_line* progress;
  llama_session* llama_target = nullptr;  // --backend llama.cpp: the target over llama.cpp
  llama_session* llama_draft = nullptr;   // and the draft (sd, cool-sd)
};

using run_fn = std::vector<token_t> (*)(const run_input&, decode_stats&);
using params_fn = json (*)(const demo_options&);

/// One method of the dispatch table.
struct method_entry {
  std::string_view name;
  unsigned tasks;                       // tasks the method runs on (mask_of)
  unsigned pending;                     // tasks where it is announced but not available yet
  std::vector<std::string_view> flags;  // method-specific flags it accepts
  run_fn run;
  params_fn params;
  std::string_view help;
};

// ---------------------------------------------------------------------------------------------
// The model as the loops see it
// ---------------------------------------------------------------------------------------------

/// The task's model as the loops see it: a transformer_session, or, with a guidance scale other
/// than 1 (`--cfg`), specula::cfg_model over a two-request transformer_batch (the prompt and its
/// null-label twin, evaluated in one forward batch). Two additions: the logits of tokens >=
/// `vocab_limit` are set to -inf (the image model's label tokens are never sampled as image
/// tokens; the target law is the model's restricted to image tokens), and each commit — one per
/// decoding step, the accepted path — advances the progress line.
class demo_session {
  // (Defined first: the members below deduce their results from it.)
  /// f(the model in use): the plain session or the guided pair.
  template <class F>
  decltype(auto) with(F&& f) {
#ifdef SPECULA_DEMO_CUDA
    if (device_) return f(*device_);
    if (device_guided_) return f(*device_guided_);
#endif
    if (llama_ != nullptr) return f(*llama_);
    return session_ ? f(*session_) : f(*guided_);
  }
  template <class F>
  decltype(auto) with(F&& f) const {
#ifdef SPECULA_DEMO_CUDA
    if (device_) return f(*device_);
    if (device_guided_) return f(*device_guided_);
#endif
    if (llama_ != nullptr) return f(std::as_const(*llama_));
    return session_ ? f(*session_) : f(*guided_);
  }

 public:
  /// With `device` (--device cuda), the loops run over the model on the GPU; with `llama`
  /// (--backend llama.cpp), over that llama.cpp model instead.
  demo_session(const ex::transformer& model, const device_model* device, index_t vocab_limit,
               progress_line* progress, double cfg_scale = 1.0, token_t null_label = -1,
               llama_session* llama = nullptr)
      : vocab_limit_(vocab_limit), progress_(progress), llama_(llama) {
    if (llama != nullptr) return;
    const auto uncond = [null_label](std::span<const token_t> prompt) {
      std::vector<token_t> u(prompt.begin(), prompt.end());
      u.front() = null_label;  // the prompt is the class label
      return u;
    };
#ifdef SPECULA_DEMO_CUDA
    if (device != nullptr) {
      if (cfg_scale == 1.0) {
        device_.emplace(*device);
        return;
      }
      // --cfg on the GPU: both streams in one device pass, the rows mixed on the host.
      device_pair_.emplace(*device, 2);
      device_guided_.emplace(*device_pair_, static_cast<float>(cfg_scale), uncond);
      return;
    }
#else
    (void)device;
#endif
    if (cfg_scale == 1.0) {
      session_.emplace(model);
      return;
    }
    pair_.emplace(model, 2);
    guided_.emplace(*pair_, static_cast<float>(cfg_scale), uncond);
  }
  demo_session(const demo_session&) = delete;
  demo_session& operator=(const demo_session&) = delete;

  [[nodiscard]] index_t vocab_size() const {
    return with([](const auto& m) { return m.vocab_size(); });
  }
  void prefill(std::span<const token_t> prompt) {
    with([&](auto& m) { m.prefill(prompt); });
  }
  [[nodiscard]] index_t context_size() const {
    return with([](const auto& m) { return m.context_size(); });
  }
  void rollback(index_t n) {
    with([&](auto& m) { m.rollback(n); });
  }

  void evaluate(const specula::token_tree& nodes, specula::batch_view<float> logits) {
    with([&](auto& m) { m.evaluate(nodes, logits); });
    const index_t V = vocab_size();
    if (vocab_limit_ >= V) return;
    for (index_t i = 0; i < nodes.size(); ++i)
      for (index_t v = vocab_limit_; v < V; ++v)
        logits[i][v] = -std::numeric_limits<float>::infinity();
  }

  void commit(std::span<const index_t> path) {
    with([&](auto& m) { m.commit(path); });
    if (progress_ != nullptr) progress_->advance(static_cast<index_t>(path.size()));
  }

 private:
  std::optional<ex::transformer_session> session_;
#ifdef SPECULA_DEMO_CUDA
  std::optional<ex::device_session> device_;
  std::optional<ex::device_batch> device_pair_;
  std::optional<specula::cfg_model<ex::device_batch>> device_guided_;
#endif
  std::optional<ex::transformer_batch> pair_;
  std::optional<specula::cfg_model<ex::transformer_batch>> guided_;
  index_t vocab_limit_;
  progress_line* progress_;
  llama_session* llama_ = nullptr;
};

static_assert(specula::session_model<demo_session>);

specula::sampling_params sampling_of(const demo_options& o) {
  specula::sampling_params s;
  s.temperature = static_cast<float>(o.temperature);
  s.top_k = o.top_k;
  s.top_p = static_cast<float>(o.top_p);
  return s;
}

json sampling_json(const demo_options& o) {
  json j = {{"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}};
  if (o.task == task_kind::image) j["cfg"] = o.cfg;
  return j;
}

// ---------------------------------------------------------------------------------------------
// Methods
// ---------------------------------------------------------------------------------------------

/// Plain autoregressive decoding: one forward pass (a one-node tree: the last token) per token,
/// then a sample from the transformed row with the stream {seed, request_id, rng.step + step} (or
/// the argmax with greedy); statistics as the loops keep them.
template <specula::session_model Model>
std::vector<token_t> ar_decode(Model& m, std::span<const token_t> prompt, index_t max_new_tokens,
                               const specula::sampling_params& params, bool greedy,
                               specula::request_rng rng, decode_stats& st) {
  if (prompt.empty())
    specula::throw_if_failed({specula::status::empty_input, -1, -1, 0.0}, "prompt");
  specula::validate_sampling_params(params);
  const index_t V = m.vocab_size();
  const auto V_sz = static_cast<std::size_t>(V);
  m.prefill(prompt);
  std::vector<token_t> out;
  std::vector<float> logits(V_sz), probs(V_sz), scratch(V_sz);
  token_t last = prompt.back();
  for (index_t step = 0; step < max_new_tokens; ++step) {
    const specula::token_tree root = specula::trees::chain(std::span<const token_t>(&last, 1));
    {
      specula::detail::scoped_timer timer(st.forward_seconds);
      m.evaluate(root, specula::batch_view<float>(logits.data(), 1, V));
      ++st.target_forwards;
    }
    {
      specula::detail::scoped_timer timer(st.verify_seconds);
      if (greedy) {
        last = static_cast<token_t>(
            specula::argmax_lowest(specula::row_view<const float>(logits.data(), V)));
      } else {
        specula::logits_to_probs(params, logits, {}, probs, scratch);
        const auto w = [&](index_t y) {
          return static_cast<double>(probs[static_cast<std::size_t>(y)]);
        };
        // The loops' numbering: steps count on from rng.step.
        const specula::request_rng step_rng{rng.seed, rng.request_id,
                                            rng.step + static_cast<std::uint32_t>(step)};
        const double u = specula::uniform_at(step_rng, specula::draw_id{0, 0});
        last = static_cast<token_t>(
            specula::sample_inverse_cdf(V, w, specula::positive_mass(V, w), u));
      }
    }
    const index_t node = 0;
    m.commit(std::span<const index_t>(&node, 1));
    st.record_step(0);
    st.step_tokens.push_back(1);
    ++st.tokens;
    out.push_back(last);
  }
  return out;
}

/// --device cuda: why the method does not run as a resident loop (rows kept on the GPU, only
/// tokens, counters and row summaries crossing), or "" when it does. Resident: sd and cool-sd
/// (chain or tree drafts, sampled; --p-min; --greedy and --draft-greedy as top-k = 1 rows, whose
/// one-hot rows make the exact rule greedy), sjd and sjd-pac (the exact variant, random
/// initialisation), jacobi and multiblock (greedy; --stochastic with the SJD ops), lookup (the
/// n-gram drafts from the committed tokens, the target's rows on the GPU; greedy as top-k = 1),
/// ar (resident SD without drafts, so that speedups compare resident with resident; greedy as
/// top-k = 1), and on the diffusion task ssd and its stepwise baseline; the image task's vocabulary
/// limit is applied on the GPU (device_transformer::set_vocab_limit). The others run through
/// device_session: the same loop as on the host, logits copied to the host each pass.
std::string non_resident_reason(const demo_options& o) {
  if (o.device != "cuda") return "not on the GPU";
  if (o.no_resident) return "--no-resident";
  if (o.cfg != 1.0) return "--cfg (the guided pair's rows are mixed on the host)";
  if (o.task == task_kind::diffusion) return "";  // ar (stepwise) and ssd
  if (o.method == "ar" || o.method == "jacobi" || o.method == "multiblock" || o.method == "lookup")
    return "";
  if (o.method == "sd" || o.method == "cool-sd") {
    if ((o.greedy || o.draft_greedy) && (o.draft_tree_width > 0 || o.draft_tree_lantern))
      return "greedy tree drafts (siblings: the draft's top tokens, chosen on the host)";
    return "";
  }
  if (o.method == "sjd" || o.method == "sjd-pac") {
    if (o.sjd_variant != "exact")
      return "--sjd-variant " + o.sjd_variant + " (the authors' deviations run on the host)";
    if (o.init.find("horizontal") != std::string::npos ||
        o.init.find("vertical") != std::string::npos)
      return "--init " + o.init + " (the spatial priors read committed rows on the host)";
    return "";
  }
  if (o.method == "lantern")
    return "lantern (no resident verifier for LANTERN++'s neighbour table)";
  return "no resident loop for --method " + o.method;
}

bool resident_loop(const demo_options& o) { return non_resident_reason(o).empty(); }

/// f(the masked diffusion model in use): the GPU model with --device cuda, else the host one.
template <class F>
std::vector<token_t> with_masked(const run_input& in, F&& f) {
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr) return f(*in.device);
#endif
  return f(in.model);
}

specula::ssd_options ssd_options_of(const demo_options& o) {
  specula::ssd_options so;
  so.gen_length = o.max_new_tokens;
  so.block_size = o.block_size;
  so.draft_length = std::max<index_t>(1, o.draft_length);
  so.tree = o.mix_order ? specula::ssd_tree::mix_order : specula::ssd_tree::chain;
  so.cache = o.cache == "dual" ? specula::ssd_cache::dual : specula::ssd_cache::none;
  so.refresh_interval = o.refresh;
  so.fallback = o.fallback;
  return so;
}

/// The diffusion task's baseline: stepwise low-confidence remasking, one position per forward
/// pass of text-diffusion.
std::vector<token_t> run_diffusion_stepwise(const run_input& in, decode_stats& st) {
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr && resident_loop(in.opt)) {
    ex::resident_ssd_rows<ex::device_transformer> rows(*in.device);
    return ex::resident_stepwise_decode(*in.device, rows, in.prompt, ssd_options_of(in.opt), &st);
  }
#endif
  return with_masked(in, [&](const auto& m) {
    return specula::diffusion_stepwise_decode(m, in.prompt, ssd_options_of(in.opt), &st);
  });
}

std::vector<token_t> run_ar(const run_input& in, decode_stats& st) {
  if (in.opt.task == task_kind::diffusion) return run_diffusion_stepwise(in, st);
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr && resident_loop(in.opt)) {
    // Resident SD without drafts: each step one pass of the root, the token drawn on the GPU
    // (a one-node tree's verification emits a sample of p).
    ex::device_sd_ops ops(*in.device, *in.device);
    ex::resident_sd_options ro;
    ro.draft_length = 0;
    ro.max_new_tokens = in.opt.max_new_tokens;
    ro.target = sampling_of(in.opt);
    if (in.opt.greedy) ro.target.top_k = 1;  // one-hot p: the verifier emits the argmax
    auto out = ex::resident_speculative_decode(ops, in.prompt, ro, in.rng, &st);
    if (in.progress != nullptr) in.progress->advance(static_cast<index_t>(out.size()));
    return out;
  }
#endif
  demo_session m(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                 in.llama_target);
  return ar_decode(m, in.prompt, in.opt.max_new_tokens, sampling_of(in.opt), in.opt.greedy, in.rng,
                   st);
}

json params_ar(const demo_options& o) {
  if (o.task == task_kind::diffusion)
    return {{"stepwise", "low-confidence remasking"},
            {"block_size", o.block_size},
            {"cache", o.cache},
            {"refresh_interval", o.refresh},
            {"greedy", true}};
  json p = {{"greedy", o.greedy}};
  if (!o.greedy) p.update(sampling_json(o));
  return p;
}

specula::resampling resampling_of(const demo_options& o) {
  if (o.resampling == "vanilla") return specula::resampling::vanilla;
  if (o.resampling == "lantern") return specula::resampling::lantern;
  if (o.resampling == "lantern-official") return specula::resampling::lantern_official;
  return specula::resampling::optimal;
}

specula::scheduled_relaxed_rule cool_rule(const demo_options& o) {
  specula::scheduled_relaxed_rule rule;
  const index_t length = std::max<index_t>(1, o.draft_length);
  if (o.cool_schedule == "uniform")
    rule.schedule = specula::relaxation_schedule::make_uniform(o.delta);
  else if (o.cool_schedule == "exponential")
    rule.schedule = specula::relaxation_schedule::make_exponential(o.delta, o.nu, length);
  else
    rule.schedule = specula::relaxation_schedule::make_linear(o.delta, o.ell, length);
  rule.resample = resampling_of(o);
  return rule;
}

/// LANTERN++ with the paper's cap (Cool-SD Eq. 4): neighbours of the drafted token x, nearest
/// codebook vector first, kept while their summed target probability is <= lambda * p(x).
specula::lantern_rule lantern_rule_of(const demo_options& o, const specula::neighbour_table& t) {
  return specula::lantern_rule::make_relative(t, o.lambda, resampling_of(o),
                                              specula::lantern_cap::paper, o.lantern_k);
}

/// The neighbour table of the image task: row t of the embedding matrix is token t's codebook
/// vector (the 4x4x3 patch, 48 values in [0, 1]); the label tokens (>= vq.codes()) get rows far
/// from every code and from each other, so they are never among a code's first codes() - 1
/// neighbours (they are never drafted: the draft is restricted to image tokens too).
specula::neighbour_table image_neighbours(const ex::vq_codebook& vq, index_t vocab, index_t k) {
  const index_t d = vq.patch_dim();
  std::vector<float> rows(static_cast<std::size_t>(vocab * d));
  for (index_t t = 0; t < vocab; ++t) {
    float* row = rows.data() + t * d;
    if (t < vq.codes()) {
      const auto code = vq.code(static_cast<token_t>(t));
      std::copy(code.begin(), code.end(), row);
    } else {
      std::fill(row, row + d, 100.0f + 10.0f * static_cast<float>(t - vq.codes()));
    }
  }
  return specula::neighbour_table(specula::batch_view<const float>(rows.data(), vocab, d), k,
                                  specula::neighbour_metric::l2);
}

/// Whether the lantern method composes Cool-SD's schedule with LANTERN++ (a schedule flag given).
bool lantern_scheduled(const demo_options& o) {
  return o.has("--cool-schedule") || o.has("--delta") || o.has("--nu") || o.has("--ell");
}

enum class sd_rule { exact, cool, lantern };

std::vector<token_t> speculative(const run_input& in, decode_stats& st, sd_rule rule) {
  const demo_options& o = in.opt;
  specula::speculative_options so;
  so.draft_length = o.draft_length;
  so.max_new_tokens = o.max_new_tokens;
  so.target = sampling_of(o);
  so.draft = sampling_of(o);
  so.mode = o.greedy || o.draft_greedy ? specula::draft_mode::greedy : specula::draft_mode::sample;
  so.draft_p_min = static_cast<float>(o.p_min);
  if (o.draft_tree_lantern)
    so.draft_tree = specula::trees::lantern_static();
  else if (o.draft_tree_width > 0 && o.draft_tree_path)
    so.draft_tree = specula::trees::first_path_siblings(o.draft_tree_width, o.draft_tree_depth);
  else if (o.draft_tree_width > 0)
    so.draft_tree = specula::trees::full(o.draft_tree_width, o.draft_tree_depth);
#ifdef SPECULA_DEMO_CUDA
  if (rule != sd_rule::lantern && in.device_draft != nullptr && resident_loop(o)) {
    ex::device_sd_ops ops(*in.device, *in.device_draft);
    ex::resident_sd_options ro;
    ro.draft_length = so.draft_length;
    ro.draft_tree = so.draft_tree;
    ro.max_new_tokens = so.max_new_tokens;
    ro.target = so.target;
    ro.draft = so.draft;
    ro.draft_p_min = so.draft_p_min;
    // Greedy drafts: one-hot q rows at the draft's argmax (top-k = 1), which the exact rule
    // verifies as speculative_decode verifies greedy drafts; --greedy: one-hot p rows too, so
    // that the exact rule emits the target's argmax (greedy verification).
    if (o.greedy || o.draft_greedy) ro.draft.top_k = 1;
    if (o.greedy) ro.target.top_k = 1;
    if (rule == sd_rule::cool && !o.greedy) ro.relaxed = cool_rule(o);
    auto out = ex::resident_speculative_decode(ops, in.prompt, ro, in.rng, &st);
    if (in.progress != nullptr) in.progress->advance(static_cast<index_t>(out.size()));
    return out;
  }
#endif
  demo_session target(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                      in.llama_target);
  // The draft sees the same vocabulary limit and, with --cfg, the same guidance.
  demo_session draft(*in.draft, in.device_draft, in.vocab_limit, nullptr, in.opt.cfg, in.null_label,
                     in.llama_draft);
  if (o.greedy)
    return specula::speculative_decode(target, draft, in.prompt, so, in.rng,
                                       specula::greedy_tree_verifier<>{}, &st);
  if (rule == sd_rule::exact)
    return specula::speculative_decode(target, draft, in.prompt, so, in.rng,
                                       specula::tree_verifier<>{}, &st);
  if (rule == sd_rule::lantern) {
    const specula::lantern_rule lantern = lantern_rule_of(o, *in.neighbours);
    if (!lantern_scheduled(o)) {
      specula::tree_verifier<specula::host::sequential_policy, specula::lantern_rule> v;
      v.rule = lantern;
      return specula::speculative_decode(target, draft, in.prompt, so, in.rng, v, &st);
    }
    // Cool-SD's schedule on LANTERN++: omega_i times the aggregated mass at draft position i.
    specula::tree_verifier<specula::host::sequential_policy, specula::scheduled_lantern_rule> v;
    v.rule = {lantern, cool_rule(o).schedule};
    return specula::speculative_decode(target, draft, in.prompt, so, in.rng, v, &st);
  }
  specula::tree_verifier<specula::host::sequential_policy, specula::scheduled_relaxed_rule> v;
  v.rule = cool_rule(o);
  return specula::speculative_decode(target, draft, in.prompt, so, in.rng, v, &st);
}

std::vector<token_t> run_sd(const run_input& in, decode_stats& st) {
  return speculative(in, st, sd_rule::exact);
}
std::vector<token_t> run_cool_sd(const run_input& in, decode_stats& st) {
  return speculative(in, st, sd_rule::cool);
}
std::vector<token_t> run_lantern(const run_input& in, decode_stats& st) {
  return speculative(in, st, sd_rule::lantern);
}

/// Prompt lookup: the n-gram proposal as the draft, no draft model.
std::vector<token_t> run_lookup(const run_input& in, decode_stats& st) {
  const demo_options& o = in.opt;
  specula::speculative_options so;
  so.max_new_tokens = o.max_new_tokens;
  so.target = sampling_of(o);
  specula::ngram_options no;
  no.draft_length = std::max<index_t>(1, o.draft_length);
  no.max_branches = o.lookup_branches;
  no.max_ngram = o.lookup_ngram;
  specula::ngram_proposal draft(no);
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr && resident_loop(o)) {
    // The drafts come from the committed tokens (host); the target's rows stay on the GPU.
    // Greedy: top-k = 1 target rows, whose exact verification is greedy decoding.
    ex::device_sjd_ops ops(*in.device);
    if (o.greedy) so.target.top_k = 1;
    auto out = ex::resident_proposal_decode(ops, draft, in.prompt, so, in.rng,
                                            specula::tree_verifier<>{}, &st);
    if (in.progress != nullptr) in.progress->advance(static_cast<index_t>(out.size()));
    return out;
  }
#endif
  demo_session target(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                      in.llama_target);
  if (o.greedy)
    return specula::speculative_decode(target, draft, in.prompt, so, in.rng,
                                       specula::greedy_tree_verifier<>{}, &st);
  return specula::speculative_decode(target, draft, in.prompt, so, in.rng,
                                     specula::tree_verifier<>{}, &st);
}

json params_lookup(const demo_options& o) {
  json p = {{"proposal", "ngram"},
            {"max_ngram", o.lookup_ngram},
            {"draft_length", std::max<index_t>(1, o.draft_length)},
            {"branches", o.lookup_branches},
            {"greedy", o.greedy}};
  if (!o.greedy) p.update(sampling_json(o));
  return p;
}

json params_sd(const demo_options& o) {
  json p = {{"draft_model", o.draft_model},
            {"draft_length", o.draft_length},
            {"draft_tree",
             o.draft_tree_lantern ? json("lantern")
             : o.draft_tree_width > 0
                 ? json(std::to_string(o.draft_tree_width) + "x" +
                        std::to_string(o.draft_tree_depth) + (o.draft_tree_path ? "/path" : ""))
                 : json("chain")},
            {"greedy", o.greedy},
            {"draft", o.greedy || o.draft_greedy ? "greedy" : "sampled"}};
  if (o.p_min > 0.0) p["p_min"] = o.p_min;
  if (!o.greedy) p.update(sampling_json(o));
  return p;
}

/// The schedule's parameters and its omega at each draft position.
void add_schedule_json(const demo_options& o, json& p) {
  p["schedule"] = o.cool_schedule;
  p["delta"] = o.delta;
  if (o.cool_schedule == "exponential") p["nu"] = o.nu;
  if (o.cool_schedule == "linear") p["ell"] = o.ell;
  const auto rule = cool_rule(o);
  json omega = json::array();
  for (index_t i = 1; i <= std::max<index_t>(1, o.draft_length); ++i)
    omega.push_back(rule.schedule.omega(i));
  p["omega"] = omega;
}

json params_cool_sd(const demo_options& o) {
  json p = params_sd(o);
  add_schedule_json(o, p);
  p["resampling"] = o.resampling;
  return p;
}

json params_lantern(const demo_options& o) {
  json p = params_sd(o);
  p["lambda"] = o.lambda;
  p["cap"] = "lambda * p(x)";
  p["k"] = o.lantern_k;
  p["neighbours"] = "l2 between codebook vectors";
  p["resampling"] = o.resampling;
  if (lantern_scheduled(o)) add_schedule_json(o, p);  // Cool-SD's schedule on LANTERN++
  return p;
}

specula::sjd_options sjd_options_of(const run_input& in, bool pac) {
  const demo_options& o = in.opt;
  specula::sjd_options so;
  if (pac) so = specula::sjd_options::sjd_pac(o.window, o.pd_width, o.pd_depth);
  so.window = o.window;
  so.count_root = o.count_root == 1;
  so.pd_full_tree = !o.pd_first_path;  // sjd-pac's default: the authors' (sjd_options::sjd_pac())
  if (pac) {
    so.adaptive_continuation = !o.no_ac;
    so.proactive_drafting = !o.no_pd;
  }
  so.init = o.init == "one-hot"             ? specula::sjd_init::one_hot_q
            : o.init == "horizontal-repeat" ? specula::sjd_init::horizontal_repeat
            : o.init == "horizontal-sample" ? specula::sjd_init::horizontal_sample
            : o.init == "horizontal-argmax" ? specula::sjd_init::horizontal_argmax
            : o.init == "vertical-repeat"   ? specula::sjd_init::vertical_repeat
            : o.init == "vertical-sample"   ? specula::sjd_init::vertical_sample
            : o.init == "vertical-argmax"   ? specula::sjd_init::vertical_argmax
                                            : specula::sjd_init::uniform_q;
  // Random initialisation draws image tokens only (as the authors' code); the spatial priors
  // follow the image grid (the generated tokens are the grid, row by row).
  so.init_tokens_end = in.vocab_limit;
  so.image_width = in.image_width;
  so.max_new_tokens = o.max_new_tokens;
  so.target = sampling_of(o);
  return so;
}

/// --device cuda: SJD / SJD-PAC as the resident loop (see resident_loop); nullopt otherwise.
std::optional<std::vector<token_t>> resident_sjd(const run_input& in,
                                                 const specula::sjd_options& so, decode_stats& st) {
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr && resident_loop(in.opt)) {
    ex::device_sjd_ops ops(*in.device);
    auto out = ex::resident_sjd_decode(ops, in.prompt, so, in.rng, specula::tree_verifier<>{}, &st);
    if (in.progress != nullptr) in.progress->advance(static_cast<index_t>(out.size()));
    return out;
  }
#else
  (void)in;
  (void)so;
  (void)st;
#endif
  return std::nullopt;
}

std::vector<token_t> run_sjd(const run_input& in, decode_stats& st) {
  if (auto out = resident_sjd(in, sjd_options_of(in, false), st)) return *std::move(out);
  demo_session m(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                 in.llama_target);
  return specula::sjd_decode(m, in.prompt, sjd_options_of(in, false), in.rng, &st);
}
std::vector<token_t> run_sjd_pac(const run_input& in, decode_stats& st) {
  demo_session m(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                 in.llama_target);
  auto so = sjd_options_of(in, true);
  if (auto out = resident_sjd(in, so, st)) return *std::move(out);
  const std::string& v = in.opt.sjd_variant;
  // The authors' code's deviations (docs/decoding.md; biased, for measurement only): (a) the
  // longest accepted sibling path, (b) siblings drawn from the AC residual.
  so.official_residual_siblings = v == "official-residual" || v == "official";
  if (v == "rule" || v == "official-longest" || v == "official")
    return specula::sjd_decode(m, in.prompt, so, in.rng,
                               specula::testing::sibling_rule_verifier{v != "rule"}, &st);
  return specula::sjd_decode(m, in.prompt, so, in.rng, &st);
}

json params_sjd(const demo_options& o) {
  json p = {{"window", o.window}, {"count_root", o.count_root == 1}, {"init", o.init}};
  p.update(sampling_json(o));
  return p;
}
json params_sjd_pac(const demo_options& o) {
  json p = params_sjd(o);
  p["adaptive_continuation"] = !o.no_ac;
  p["proactive_drafting"] = !o.no_pd;
  p["sjd_variant"] = o.sjd_variant;
  if (!o.no_pd) {
    p["pd_width"] = o.pd_width;
    p["pd_depth"] = o.pd_depth;
    p["pd_full_tree"] = !o.pd_first_path;
  }
  return p;
}

/// --init of jacobi and multiblock: repeat | random | context (the released Jacobi Forcing
/// inference code's `random.choice` over the sequence so far).
specula::jacobi_init jacobi_init_of(const std::string& init) {
  return init == "random"    ? specula::jacobi_init::random
         : init == "context" ? specula::jacobi_init::sample_context
                             : specula::jacobi_init::repeat_last;
}

/// --device cuda: a greedy loop `run(ops)` over resident_greedy_ops on the GPU (see
/// resident_loop); nullopt otherwise.
template <class Run>
std::optional<std::vector<token_t>> resident_greedy(const run_input& in, Run&& run) {
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr && resident_loop(in.opt)) {
    ex::resident_greedy_ops<ex::device_session> ops(*in.device);
    auto out = run(ops);
    if (in.progress != nullptr) in.progress->advance(static_cast<index_t>(out.size()));
    return out;
  }
#else
  (void)in;
  (void)run;
#endif
  return std::nullopt;
}

std::vector<token_t> run_jacobi(const run_input& in, decode_stats& st) {
  specula::jacobi_options jo;
  jo.window = in.opt.window;
  jo.max_new_tokens = in.opt.max_new_tokens;
  jo.init = jacobi_init_of(in.opt.init);
  if (auto out = resident_greedy(in, [&](auto& ops) {
        return ex::resident_jacobi_decode(ops, in.prompt, jo, in.rng, &st);
      }))
    return *std::move(out);
  demo_session m(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                 in.llama_target);
  return specula::jacobi_decode(m, in.prompt, jo, in.rng, &st);
}
json params_jacobi(const demo_options& o) {
  return {{"window", o.window}, {"init", o.init}, {"greedy", true}};
}

std::vector<token_t> run_multiblock(const run_input& in, decode_stats& st) {
  specula::multiblock_options mo;
  mo.block_size = in.opt.block_size;
  mo.max_blocks = in.opt.blocks;
  mo.spawn_ratio = in.opt.spawn_ratio;
  mo.recycling = !in.opt.no_recycling && !in.opt.stochastic;
  mo.verify_past_ra = !in.opt.ra_only;
  mo.stochastic = in.opt.stochastic;
  if (mo.stochastic) mo.target = sampling_of(in.opt);
  mo.pool_size = in.opt.pool_size;
  mo.pool =
      in.opt.pool == "per-key" ? specula::multiblock_pool::per_key : specula::multiblock_pool::fifo;
  mo.spawn = in.opt.spawn == "any" ? specula::multiblock_spawn::any_block
                                   : specula::multiblock_spawn::newest_block;
  mo.ngram_length = in.opt.ngram;
  mo.max_new_tokens = in.opt.max_new_tokens;
  mo.init = jacobi_init_of(in.opt.init);
#ifdef SPECULA_DEMO_CUDA
  if (mo.stochastic && in.device != nullptr && resident_loop(in.opt)) {
    // The sampled window's rows stay on the GPU with the SJD ops (AC draws, as SJD-PAC's).
    ex::device_sjd_ops ops(*in.device);
    auto out =
        ex::resident_multiblock_decode(ops, in.prompt, mo, in.rng, specula::tree_verifier<>{}, &st);
    if (in.progress != nullptr) in.progress->advance(static_cast<index_t>(out.size()));
    return out;
  }
#endif
  if (!mo.stochastic)
    if (auto out = resident_greedy(in, [&](auto& ops) {
          return ex::resident_multiblock_decode(ops, in.prompt, mo, in.rng, &st);
        }))
      return *std::move(out);
  demo_session m(in.model, in.device, in.vocab_limit, in.progress, in.opt.cfg, in.null_label,
                 in.llama_target);
  return specula::multiblock_decode(m, in.prompt, mo, in.rng, &st);
}
json params_multiblock(const demo_options& o) {
  const bool recycling = !o.no_recycling && !o.stochastic;
  json p = {{"block_size", o.block_size}, {"blocks", o.blocks}, {"spawn_ratio", o.spawn_ratio},
            {"recycling", recycling},     {"init", o.init},     {"greedy", !o.stochastic}};
  p["spawn"] = o.spawn;
  p["verify_past_ra"] = !o.ra_only;
  if (o.stochastic) {
    p["stochastic"] = true;
    p.update(sampling_json(o));
  }
  if (recycling) {
    p["pool"] = o.pool;
    p["pool_size"] = o.pool_size;
    if (o.pool == "per-key") p["ngram"] = o.ngram;
  }
  return p;
}

/// Self-speculative decoding of the masked diffusion model (text-diffusion).
std::vector<token_t> run_ssd(const run_input& in, decode_stats& st) {
#ifdef SPECULA_DEMO_CUDA
  if (in.device != nullptr && resident_loop(in.opt)) {
    ex::resident_ssd_rows<ex::device_transformer> rows(*in.device);
    return ex::resident_ssd_decode(*in.device, rows, in.prompt, ssd_options_of(in.opt), &st);
  }
#endif
  return with_masked(in, [&](const auto& m) {
    return specula::ssd_decode(m, in.prompt, ssd_options_of(in.opt), &st);
  });
}
json params_ssd(const demo_options& o) {
  return {{"draft_length", std::max<index_t>(1, o.draft_length)},
          {"block_size", o.block_size},
          {"tree", o.mix_order ? "mix-order" : "chain"},
          {"cache", o.cache},
          {"refresh_interval", o.refresh},
          {"fallback", o.fallback},
          {"greedy", true}};
}

constexpr unsigned text_bit = mask_of(task_kind::text);
constexpr unsigned image_bit = mask_of(task_kind::image);
constexpr unsigned diffusion_bit = mask_of(task_kind::diffusion);

/// The dispatch table: method name -> tasks, flags, function.
const std::vector<method_entry>& methods() {
  static const std::vector<method_entry> table = {
      {"ar",
       text_bit | image_bit | diffusion_bit,
       0,
       {"--greedy", "--block-size", "--cache", "--refresh"},
       run_ar,
       params_ar,
       "autoregressive sampling with the target model, one forward pass per token"},
      {"sd",
       text_bit | image_bit,
       0,
       {"--draft-length", "--draft-tree", "--greedy", "--draft-greedy", "--draft-model", "--p-min"},
       run_sd,
       params_sd,
       "draft-model speculative decoding (exact verification; drafts: text-draft, image-draft)"},
      {"lookup",
       text_bit,
       0,
       {"--draft-length", "--greedy", "--lookup-branches", "--lookup-ngram"},
       run_lookup,
       params_lookup,
       "prompt lookup: n-gram drafts from the context, no draft model (exact verification)"},
      {"sjd",
       text_bit | image_bit,
       0,
       {"--window", "--init", "--count-root", "--no-count-root"},
       run_sjd,
       params_sjd,
       "speculative Jacobi decoding"},
      {"sjd-pac",
       text_bit | image_bit,
       0,
       {"--window", "--init", "--pd-width", "--pd-depth", "--no-ac", "--no-pd", "--count-root",
        "--no-count-root", "--pd-first-path", "--sjd-variant"},
       run_sjd_pac,
       params_sjd_pac,
       "SJD with Adaptive Continuation and Proactive Drafting"},
      {"cool-sd",
       text_bit | image_bit,
       0,
       {"--draft-length", "--draft-tree", "--draft-greedy", "--draft-model", "--cool-schedule",
        "--delta", "--nu", "--ell", "--resampling"},
       run_cool_sd,
       params_cool_sd,
       "speculative decoding with Cool-SD's relaxed (lossy) acceptance"},
      {"lantern",
       image_bit,
       0,
       {"--draft-length", "--draft-tree", "--draft-greedy", "--lambda", "--lantern-k",
        "--resampling", "--cool-schedule", "--delta", "--nu", "--ell"},
       run_lantern,
       params_lantern,
       "speculative decoding with LANTERN++'s relaxed (lossy) acceptance (codebook neighbours)"},
      {"jacobi",
       text_bit | image_bit,
       0,
       {"--window", "--init"},
       run_jacobi,
       params_jacobi,
       "greedy Jacobi decoding (output equals greedy decoding)"},
      {"multiblock",
       text_bit | image_bit,
       0,
       {"--block-size", "--blocks", "--spawn-ratio", "--no-recycling", "--pool-size", "--ngram",
        "--init", "--pool", "--spawn", "--ra-only", "--stochastic"},
       run_multiblock,
       params_multiblock,
       "multi-block Jacobi decoding with rejection recycling (greedy; --stochastic: sampled)"},
      {"ssd",
       diffusion_bit,
       0,
       {"--draft-length", "--block-size", "--mix-order", "--cache", "--refresh", "--fallback"},
       run_ssd,
       params_ssd,
       "self-speculative decoding of the masked diffusion model (greedy, = stepwise)"},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// Argument parsing
// ---------------------------------------------------------------------------------------------

void print_help() {
  std::printf(
      "usage: specula_demo --task text|image|diffusion --method METHOD [options]\n"
      "\n"
      "methods:\n");
  for (const auto& m : methods()) {
    std::string tasks;
    for (const task_kind t : {task_kind::text, task_kind::image, task_kind::diffusion})
      if ((m.tasks & mask_of(t)) != 0)
        tasks += std::string(tasks.empty() ? "" : ",") + task_name(t);
    std::printf("  %-11s %s [%s]\n", std::string(m.name).c_str(), std::string(m.help).c_str(),
                tasks.c_str());
  }
  std::printf(
      "\n"
      "common options:\n"
      "  --temperature T      sampling temperature (> 0, default 1)\n"
      "  --top-k K            keep the K most likely tokens (0: off, default)\n"
      "  --top-p P            nucleus mass in (0, 1] (1: off, default)\n"
      "  --seed S             random seed (default 1); sample i uses request id i\n"
      "  --max-new-tokens N   tokens to generate (text: default 128; image: the whole grid)\n"
      "  --num-samples N      requests to decode, one after the other (default 1)\n"
      "  --warmup N           untimed requests decoded first, each on its own random stream\n"
      "                       after the timed ones' (first-use costs: CUDA module loading,\n"
      "                       graph capture, allocations; default 0)\n"
      "  --threads N          threads of the example backend's products and attention, for\n"
      "                       every model of the run (default 1; 0: one per hardware thread)\n"
      "  --device cpu|cuda    run the models on the CPU (default: the example backend) or on\n"
      "                       the GPU (device_transformer; CUDA builds); ar, sd and cool-sd\n"
      "                       (chain or tree drafts, --p-min; greedy with chain drafts),\n"
      "                       sjd and sjd-pac (exact variant, random init), jacobi and\n"
      "                       multiblock on the text and image tasks, and ssd and ar on the\n"
      "                       diffusion task keep their rows on the GPU (resident loops);\n"
      "                       the others (lookup, lantern, --cfg, the spatial priors, the\n"
      "                       authors' sjd variants) run the host's loop over the GPU model\n"
      "                       (logits to the host each pass; the run says so on stderr)\n"
      "  --no-resident        with --device cuda: no resident loops (every loop copies its\n"
      "                       logits rows to the host, as on the CPU)\n"
      "  --prompt TEXT        text prompt (bytes; default: the start of a Python class)\n"
      "  --label C            image class: 0..7, a class name, or -1 (null label); default 0\n"
      "  --model NAME         text: text-target (default), text-target-jf (text-target\n"
      "                       fine-tuned with Jacobi Forcing: jacobi and multiblock converge\n"
      "                       faster; its own greedy output) or text-target-xl (18 M\n"
      "                       parameters, 70 MiB of fp32 weights: a pass streams them from\n"
      "                       DRAM, where drafting pays)\n"
      "  --image-model NAME   image-ar-256 (default: 64x64, a 16x16 grid of 256 tokens) or\n"
      "                       image-ar (32x32, an 8x8 grid of 64 tokens)\n"
      "  --cfg S              image: classifier-free guidance scale (default 1: off); the\n"
      "                       null-label stream runs in the same forward batch, and\n"
      "                       temperature / top-k / top-p apply to the guided logits\n"
      "  --models-dir DIR     the shipped models (default " SPECULA_MODELS_DIR
      ")\n"
      "  --backend B          specula (the example backend, default) or llama.cpp (text task:\n"
      "                       the same models as GGUF in llama.cpp; -DSPECULA_WITH_LLAMA_CPP=ON)\n"
      "  --gguf-dir DIR       --backend llama.cpp: the GGUF files (tools/to_gguf.py --all DIR;\n"
      "                       default: the build's gguf/)\n"
      "  --out-dir DIR        image output (default specula_demo_out)\n"
      "  --scale F            image upscaling factor, nearest neighbour (default 8)\n"
      "  --json               print one JSON object with the statistics and outputs\n"
      "  --quiet              no progress line on stderr\n"
      "\n"
      "method options:\n"
      "  --greedy             ar: argmax decoding; sd: greedy drafts and greedy verification\n"
      "  --draft-greedy       sd, cool-sd, lantern: greedy drafts, stochastic verification\n"
      "  --draft-length N     sd, cool-sd, lantern: drafted tokens per step (default 4); the\n"
      "                       draft model is text-draft (text) or image-draft (image, with\n"
      "                       image-ar-256 only; --cfg guides it with the same scale)\n"
      "  --draft-model NAME   sd, cool-sd, text: text-draft (default) or text-target (a\n"
      "                       draft for --model text-target-xl only)\n"
      "  --draft-tree WxD     sd, cool-sd, lantern: draft a full W-ary tree of D levels per step\n"
      "                       instead of a chain (siblings without replacement; greedy: top W);\n"
      "                       --draft-tree WxD/path: W siblings per level on the first path\n"
      "                       only (1 + W*D nodes: a chain with alternatives)\n"
      "                       --draft-tree lantern: LANTERN's static 57-node tree\n"
      "  --window N           sjd (default 16), sjd-pac (64), jacobi (16): draft window; sjd,\n"
      "                       sjd-pac: a fixed budget of drafted nodes, PD tree included\n"
      "  --count-root         sjd, sjd-pac: --window and --pd-depth count the root, as the\n"
      "                       authors' code (sjd-pac's default; --no-count-root: they do not,\n"
      "                       sjd's default)\n"
      "  --init MODE          sjd, sjd-pac: uniform (default) | one-hot | horizontal-repeat |\n"
      "                       horizontal-sample | horizontal-argmax | vertical-repeat |\n"
      "                       vertical-sample | vertical-argmax (spatial priors on the image\n"
      "                       grid; random tokens are image tokens); jacobi, multiblock:\n"
      "                       context (default: tokens drawn uniformly from the sequence so\n"
      "                       far, as the released Jacobi Forcing code) | repeat | random\n"
      "  --pd-width K         sjd-pac: Proactive Drafting candidates per node (default 4)\n"
      "  --pd-depth D         sjd-pac: Proactive Drafting depth (default 3; candidate levels\n"
      "                       below the emitted token, one fewer under --count-root)\n"
      "  --pd-first-path      sjd-pac: K candidates per level along the first path only (K D\n"
      "                       nodes) instead of the full K-ary tree\n"
      "  --sjd-variant V      sjd-pac: exact (default) | rule (the tree rule written out) |\n"
      "                       official-longest (the authors' code's longest accepted sibling\n"
      "                       path) | official-residual (its siblings from the AC residual) |\n"
      "                       official (both); the official ones are biased, to measure them\n"
      "  --no-ac, --no-pd     sjd-pac: disable Adaptive Continuation / Proactive Drafting\n"
      "  --p-min P            sd: dynamic draft length, stop drafting when the draft's most\n"
      "                       likely token has probability < P (llama.cpp's p_min; default 0)\n"
      "  --lookup-branches B  lookup: n-gram continuations drafted per step as a tree (1..16,\n"
      "                       default 1: a chain); --draft-length: tokens per continuation\n"
      "  --lookup-ngram N     lookup: longest context suffix looked up (1..64, default 3)\n"
      "  --cool-schedule S    cool-sd: uniform (default) | exponential | linear; lantern:\n"
      "                       any schedule flag applies the schedule's omega_i to LANTERN++'s\n"
      "                       aggregated mass (Cool-SD's schedule on LANTERN++)\n"
      "  --delta D            cool-sd, lantern: relaxation budget (> 0, default 2; 1 with the\n"
      "                       uniform schedule = exact rule for cool-sd, LANTERN++ for lantern)\n"
      "  --nu NU              cool-sd exponential: decay (>= 0, default 0.7)\n"
      "  --ell L              cool-sd linear: slope parameter (>= 2, default 8)\n"
      "  --resampling R       cool-sd: optimal (default) | vanilla; lantern: optimal (default) |\n"
      "                       vanilla | lantern (LANTERN++ Eq. 6) | lantern-official (its code)\n"
      "  --lambda L           lantern: LANTERN++ cap, neighbours of the drafted token x kept\n"
      "                       while their summed target probability is <= L p(x) (>= 0,\n"
      "                       default 1; LANTERN's code's --lantern_delta D is L = D - 1)\n"
      "  --lantern-k K        lantern: neighbours walked, nearest codebook vector (L2) first\n"
      "                       (1 .. 127, default 10)\n"
      "  --block-size N       multiblock: block size (default 64); ssd, diffusion ar: semi-AR\n"
      "                       block size (default 8, the SSD paper's)\n"
      "  --blocks K           multiblock: blocks kept (default 2)\n"
      "  --spawn-ratio R      multiblock: spawn a block at ceil(R n) accepted tokens (0.85)\n"
      "  --no-recycling       multiblock: no n-gram pool\n"
      "  --pool-size N        multiblock: pooled sequences (fifo; up to N - 1 candidates per\n"
      "                       step) or candidates per key (per-key); default 4\n"
      "  --pool P             multiblock: fifo (default: the released code's pool of whole\n"
      "                       sequences) | per-key (n-grams keyed by their first token)\n"
      "  --ngram N            multiblock --pool per-key: tokens per n-gram (default 16)\n"
      "  --spawn S            multiblock: newest (default: only the newest block spawns, as the\n"
      "                       released code) | any (any block that reaches the ratio)\n"
      "  --ra-only            multiblock: accept within the real-active block only, as the\n"
      "                       released code (default: verification may run past it)\n"
      "  --stochastic         multiblock: the sampled variant (exact verification of the\n"
      "                       window, SJD's Adaptive Continuation update; lossless for the\n"
      "                       sampled law; no recycling); --temperature/--top-k/--top-p apply\n"
      "  --mix-order          ssd: the mix-order verification tree (2N nodes)\n"
      "  --cache none|dual    ssd, diffusion ar: evaluate through the dual (prefix and suffix)\n"
      "                       KV cache (default dual, the SSD paper's setting) or whole\n"
      "                       sequences every pass (none)\n"
      "  --refresh R          ssd, diffusion ar with --cache dual: refresh the cache at every\n"
      "                       block start and every R steps within a block (default 8)\n"
      "  --fallback           ssd: decode stepwise once fewer than N positions are masked\n"
      "\n"
      "exit codes: 0 success, 1 runtime error, 2 bad arguments, 3 method not available yet\n");
}

index_t parse_int(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw usage_error(flag + ": expected an integer, got '" + text + "'");
  return static_cast<index_t>(v);
}

double parse_double(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v))
    throw usage_error(flag + ": expected a finite number, got '" + text + "'");
  return v;
}

void require(bool ok, const std::string& flag, const std::string& what) {
  if (!ok) throw usage_error(flag + ": " + what);
}

demo_options parse_args(int argc, char** argv) {
  demo_options o;
  bool have_task = false, have_method = false;
  std::string task;
  const std::vector<std::string_view> switches = {
      "--greedy",        "--draft-greedy",  "--no-ac",     "--no-pd",       "--json",
      "--quiet",         "--no-recycling",  "--mix-order", "--fallback",    "--count-root",
      "--no-count-root", "--pd-first-path", "--ra-only",   "--no-resident", "--stochastic"};
  const std::vector<std::string_view> valued = {
      "--task",          "--method",         "--temperature", "--top-k",      "--top-p",
      "--seed",          "--max-new-tokens", "--prompt",      "--label",      "--num-samples",
      "--threads",       "--models-dir",     "--out-dir",     "--scale",      "--draft-length",
      "--draft-tree",    "--window",         "--init",        "--pd-width",   "--pd-depth",
      "--cool-schedule", "--delta",          "--nu",          "--ell",        "--resampling",
      "--block-size",    "--blocks",         "--spawn-ratio", "--pool-size",  "--ngram",
      "--pool",          "--spawn",          "--cache",       "--refresh",    "--image-model",
      "--cfg",           "--lambda",         "--lantern-k",   "--model",      "--backend",
      "--gguf-dir",      "--draft-model",    "--device",      "--sjd-variant"};
  const std::vector<std::string_view> valued_more = {"--p-min", "--lookup-branches",
                                                     "--lookup-ngram", "--warmup"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_help();
      std::exit(0);
    }
    std::string value;
    bool has_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    const bool is_switch = std::find(switches.begin(), switches.end(), arg) != switches.end();
    const bool is_valued =
        std::find(valued.begin(), valued.end(), arg) != valued.end() ||
        std::find(valued_more.begin(), valued_more.end(), arg) != valued_more.end();
    if (!is_switch && !is_valued) throw usage_error("unknown argument '" + arg + "'");
    if (is_switch && has_value) throw usage_error(arg + ": takes no value");
    if (is_valued && !has_value) {
      if (i + 1 >= argc) throw usage_error(arg + ": missing value");
      value = argv[++i];
    }
    const std::string& flag = arg;
    if (o.has(flag)) throw usage_error(flag + ": given more than once");
    o.given.push_back(flag);

    if (flag == "--task") {
      task = value;
      have_task = true;
    } else if (flag == "--method") {
      o.method = value;
      have_method = true;
    } else if (flag == "--temperature") {
      o.temperature = parse_double(flag, value);
    } else if (flag == "--top-k") {
      o.top_k = parse_int(flag, value);
    } else if (flag == "--top-p") {
      o.top_p = parse_double(flag, value);
    } else if (flag == "--cfg") {
      o.cfg = parse_double(flag, value);
    } else if (flag == "--seed") {
      const index_t s = parse_int(flag, value);
      require(s >= 0, flag, "must be >= 0");
      o.seed = static_cast<std::uint64_t>(s);
    } else if (flag == "--max-new-tokens") {
      o.max_new_tokens = parse_int(flag, value);
    } else if (flag == "--prompt") {
      o.prompt = value;
    } else if (flag == "--label") {
      o.label = value;
    } else if (flag == "--image-model") {
      o.image_model = value;
    } else if (flag == "--model") {
      o.text_model = value;
    } else if (flag == "--draft-model") {
      o.draft_model = value;
    } else if (flag == "--num-samples") {
      o.num_samples = parse_int(flag, value);
    } else if (flag == "--warmup") {
      o.warmup = parse_int(flag, value);
    } else if (flag == "--device") {
      o.device = value;
    } else if (flag == "--threads") {
      o.threads = parse_int(flag, value);
    } else if (flag == "--models-dir") {
      o.models_dir = value;
    } else if (flag == "--backend") {
      o.backend = value;
    } else if (flag == "--gguf-dir") {
      o.gguf_dir = value;
    } else if (flag == "--out-dir") {
      o.out_dir = value;
    } else if (flag == "--scale") {
      o.scale = parse_int(flag, value);
    } else if (flag == "--draft-length") {
      o.draft_length = parse_int(flag, value);
    } else if (flag == "--draft-tree" && value == "lantern") {
      o.draft_tree_lantern = true;
    } else if (flag == "--p-min") {
      o.p_min = parse_double(flag, value);
    } else if (flag == "--lookup-branches") {
      o.lookup_branches = parse_int(flag, value);
    } else if (flag == "--lookup-ngram") {
      o.lookup_ngram = parse_int(flag, value);
    } else if (flag == "--draft-tree") {
      const auto x = value.find('x');
      if (x == std::string::npos)
        throw usage_error("--draft-tree: expected WxD, got '" + value + "'");
      std::string depth = value.substr(x + 1);
      if (depth.ends_with("/path")) {
        o.draft_tree_path = true;
        depth.resize(depth.size() - 5);
      }
      o.draft_tree_width = parse_int(flag, value.substr(0, x));
      o.draft_tree_depth = parse_int(flag, depth);
    } else if (flag == "--window") {
      o.window = parse_int(flag, value);
    } else if (flag == "--init") {
      o.init = value;
    } else if (flag == "--pd-width") {
      o.pd_width = parse_int(flag, value);
    } else if (flag == "--pd-depth") {
      o.pd_depth = parse_int(flag, value);
    } else if (flag == "--cool-schedule") {
      o.cool_schedule = value;
    } else if (flag == "--delta") {
      o.delta = parse_double(flag, value);
    } else if (flag == "--nu") {
      o.nu = parse_double(flag, value);
    } else if (flag == "--ell") {
      o.ell = parse_double(flag, value);
    } else if (flag == "--resampling") {
      o.resampling = value;
    } else if (flag == "--lambda") {
      o.lambda = parse_double(flag, value);
    } else if (flag == "--lantern-k") {
      o.lantern_k = parse_int(flag, value);
    } else if (flag == "--block-size") {
      o.block_size = parse_int(flag, value);
    } else if (flag == "--blocks") {
      o.blocks = parse_int(flag, value);
    } else if (flag == "--spawn-ratio") {
      o.spawn_ratio = parse_double(flag, value);
    } else if (flag == "--pool-size") {
      o.pool_size = parse_int(flag, value);
    } else if (flag == "--ngram") {
      o.ngram = parse_int(flag, value);
    } else if (flag == "--pool") {
      o.pool = value;
    } else if (flag == "--spawn") {
      o.spawn = value;
    } else if (flag == "--no-recycling") {
      o.no_recycling = true;
    } else if (flag == "--sjd-variant") {
      o.sjd_variant = value;
    } else if (flag == "--ra-only") {
      o.ra_only = true;
    } else if (flag == "--stochastic") {
      o.stochastic = true;
    } else if (flag == "--mix-order") {
      o.mix_order = true;
    } else if (flag == "--cache") {
      o.cache = value;
    } else if (flag == "--refresh") {
      o.refresh = parse_int(flag, value);
    } else if (flag == "--fallback") {
      o.fallback = true;
    } else if (flag == "--greedy") {
      o.greedy = true;
    } else if (flag == "--draft-greedy") {
      o.draft_greedy = true;
    } else if (flag == "--no-ac") {
      o.no_ac = true;
    } else if (flag == "--no-resident") {
      o.no_resident = true;
    } else if (flag == "--no-pd") {
      o.no_pd = true;
    } else if (flag == "--pd-first-path") {
      o.pd_first_path = true;
    } else if (flag == "--count-root") {
      o.count_root = 1;
    } else if (flag == "--no-count-root") {
      o.count_root = 0;
    } else if (flag == "--json") {
      o.json_output = true;
    } else if (flag == "--quiet") {
      o.quiet = true;
    }
  }

  if (!have_task) throw usage_error("--task: missing (text, image or diffusion)");
  if (!have_method) throw usage_error("--method: missing (see --help for the methods)");
  if (task == "text")
    o.task = task_kind::text;
  else if (task == "image")
    o.task = task_kind::image;
  else if (task == "diffusion")
    o.task = task_kind::diffusion;
  else
    throw usage_error("--task: unknown task '" + task + "' (text, image or diffusion)");
  return o;
}

const method_entry& find_method(const demo_options& o) {
  const auto& table = methods();
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const method_entry& m) { return m.name == o.method; });
  if (it == table.end()) {
    std::string names;
    for (const auto& m : table)
      names += std::string(names.empty() ? "" : ", ") + std::string(m.name);
    throw usage_error("--method: unknown method '" + o.method + "' (" + names + ")");
  }
  if ((it->tasks & mask_of(o.task)) == 0) {
    std::string tasks;
    for (const task_kind t : {task_kind::text, task_kind::image, task_kind::diffusion})
      if ((it->tasks & mask_of(t)) != 0)
        tasks += std::string(tasks.empty() ? "" : ", ") + task_name(t);
    throw usage_error("--method: method '" + o.method + "' is not valid for task '" +
                      task_name(o.task) + "' (it runs on: " + tasks + ")");
  }
  return *it;
}

/// Checks the flags against the method, fills in method and task defaults, checks ranges.
void resolve(demo_options& o, const method_entry& m) {
  const std::vector<std::string_view> method_flags = {
      "--greedy",        "--draft-greedy", "--draft-length", "--draft-tree",    "--window",
      "--init",          "--pd-width",     "--pd-depth",     "--no-ac",         "--no-pd",
      "--cool-schedule", "--delta",        "--nu",           "--ell",           "--resampling",
      "--block-size",    "--blocks",       "--spawn-ratio",  "--no-recycling",  "--pool-size",
      "--ngram",         "--pool",         "--spawn",        "--mix-order",     "--cache",
      "--refresh",       "--fallback",     "--count-root",   "--no-count-root", "--pd-first-path",
      "--lambda",        "--lantern-k",    "--ra-only",      "--draft-model",   "--sjd-variant"};
  const std::vector<std::string_view> method_flags_more = {"--p-min", "--lookup-branches",
                                                           "--lookup-ngram", "--stochastic"};
  for (const auto& f : o.given)
    if ((std::find(method_flags.begin(), method_flags.end(), f) != method_flags.end() ||
         std::find(method_flags_more.begin(), method_flags_more.end(), f) !=
             method_flags_more.end()) &&
        std::find(m.flags.begin(), m.flags.end(), f) == m.flags.end())
      throw usage_error(f + ": not used by method '" + o.method + "'");
  if (o.has("--prompt") && o.task == task_kind::image)
    throw usage_error("--prompt: not used by task image (use --label)");
  for (const char* f : {"--label", "--image-model", "--out-dir", "--scale", "--cfg"})
    if (o.has(f) && o.task != task_kind::image)
      throw usage_error(std::string(f) + ": only used by task image");

  // Sampling parameters.
  require(o.temperature > 0.0, "--temperature", "must be > 0 (use --greedy for argmax decoding)");
  require(o.top_k >= 0, "--top-k", "must be >= 0");
  require(o.top_p > 0.0 && o.top_p <= 1.0, "--top-p", "must be in (0, 1]");
  require(std::isfinite(o.cfg) && std::abs(o.cfg) <= 100.0, "--cfg", "must be in [-100, 100]");
  const bool sampling_ignored = o.method == "jacobi" || o.greedy;
  for (const char* f : {"--temperature", "--top-k", "--top-p"})
    if (o.has(f) && sampling_ignored && !o.quiet)
      std::fprintf(stderr, "specula_demo: warning: %s is ignored (%s decoding is greedy)\n", f,
                   o.method.c_str());

  require(o.num_samples >= 1 && o.num_samples <= 4096, "--num-samples", "must be in [1, 4096]");
  require(o.warmup >= 0 && o.warmup <= 64, "--warmup", "must be in [0, 64]");
  require(o.threads >= 0 && o.threads <= 256, "--threads", "must be in [0, 256]");
  require(o.device == "cpu" || o.device == "cuda", "--device", "must be cpu or cuda");
  if (o.device == "cuda") {
#ifdef SPECULA_DEMO_CUDA
    require(ex::cuda_device_available(), "--device", "no CUDA device");
#else
    require(false, "--device", "this build has no CUDA (specula_example_cuda was not built)");
#endif
  }
  require(o.scale >= 1 && o.scale <= 64, "--scale", "must be in [1, 64]");
  require(o.draft_length >= 0 && o.draft_length <= 64, "--draft-length", "must be in [0, 64]");
  require(o.p_min >= 0.0 && o.p_min <= 1.0, "--p-min", "must be in [0, 1]");
  require(o.lookup_branches >= 1 && o.lookup_branches <= 16, "--lookup-branches",
          "must be in [1, 16]");
  require(o.lookup_ngram >= 1 && o.lookup_ngram <= 64, "--lookup-ngram", "must be in [1, 64]");
  if (o.has("--draft-tree") && !o.draft_tree_lantern) {
    require(o.draft_tree_width >= 1 && o.draft_tree_width <= 8, "--draft-tree",
            "width W must be in [1, 8]");
    require(o.draft_tree_depth >= 1 && o.draft_tree_depth <= 16, "--draft-tree",
            "depth D must be in [1, 16]");
    double nodes = 1.0, level = 1.0;
    for (index_t d = 0; d < o.draft_tree_depth; ++d)
      nodes += o.draft_tree_path ? static_cast<double>(o.draft_tree_width)
                                 : (level *= static_cast<double>(o.draft_tree_width));
    require(nodes <= 512.0, "--draft-tree", "W^1 + ... + W^D must be at most 511 drafts");
  }
  if (o.greedy && o.draft_greedy) throw usage_error("--draft-greedy: implied by --greedy");

  // Windows and initialisation.
  if (o.window < 0) o.window = o.method == "sjd-pac" ? 64 : 16;
  if (o.count_root < 0) o.count_root = o.method == "sjd-pac" ? 1 : 0;
  require(o.window >= 1 && o.window <= 256, "--window", "must be in [1, 256]");
  require(o.sjd_variant == "exact" || o.sjd_variant == "rule" ||
              o.sjd_variant == "official-longest" || o.sjd_variant == "official-residual" ||
              o.sjd_variant == "official",
          "--sjd-variant",
          "must be exact, rule, official-longest, official-residual or official, got '" +
              o.sjd_variant + "'");
  if (o.method == "sjd" || o.method == "sjd-pac") {
    if (o.init.empty()) o.init = "uniform";
    require(o.init == "uniform" || o.init == "one-hot" || o.init == "horizontal-repeat" ||
                o.init == "horizontal-sample" || o.init == "horizontal-argmax" ||
                o.init == "vertical-repeat" || o.init == "vertical-sample" ||
                o.init == "vertical-argmax",
            "--init",
            "must be uniform, one-hot, horizontal-repeat, horizontal-sample, horizontal-argmax, "
            "vertical-repeat, vertical-sample or vertical-argmax for method " +
                o.method + ", got '" + o.init + "'");
  } else if (o.method == "jacobi") {
    if (o.init.empty()) o.init = "context";
    require(o.init == "repeat" || o.init == "random" || o.init == "context", "--init",
            "must be context, repeat or random for method jacobi, got '" + o.init + "'");
  }
  if (o.method == "multiblock") {
    if (o.init.empty()) o.init = "context";
    require(o.init == "repeat" || o.init == "random" || o.init == "context", "--init",
            "must be context, repeat or random for method multiblock, got '" + o.init + "'");
    require(!(o.stochastic && o.ra_only), "--ra-only",
            "not with --stochastic (the sampled variant verifies the whole window)");
  }
  if (o.block_size < 0) o.block_size = o.method == "multiblock" ? 64 : 8;
  require(o.block_size >= 1 && o.block_size <= 256, "--block-size", "must be in [1, 256]");
  require(o.blocks >= 1 && o.blocks <= 16, "--blocks", "must be in [1, 16]");
  require(o.spawn_ratio > 0.0 && o.spawn_ratio <= 1.0, "--spawn-ratio", "must be in (0, 1]");
  require(o.pool_size >= 0 && o.pool_size <= 64, "--pool-size", "must be in [0, 64]");
  require(o.ngram >= 1 && o.ngram <= 256, "--ngram", "must be in [1, 256]");
  require(o.pool == "fifo" || o.pool == "per-key", "--pool",
          "must be fifo or per-key, got '" + o.pool + "'");
  require(o.spawn == "newest" || o.spawn == "any", "--spawn",
          "must be newest or any, got '" + o.spawn + "'");
  if (o.has("--ngram") && o.pool != "per-key")
    throw usage_error("--ngram: only used with --pool per-key");
  if (o.method == "ssd") require(o.draft_length >= 1, "--draft-length", "must be >= 1 for ssd");
  if ((o.has("--cache") || o.has("--refresh")) && o.task != task_kind::diffusion)
    throw usage_error(std::string(o.has("--cache") ? "--cache" : "--refresh") +
                      ": only used by task diffusion");
  if (o.cache.empty()) o.cache = o.task == task_kind::diffusion ? "dual" : "none";
  require(o.cache == "none" || o.cache == "dual", "--cache",
          "must be none or dual, got '" + o.cache + "'");
  require(o.refresh >= 1, "--refresh", "must be >= 1");
  if (o.has("--refresh") && o.cache != "dual") throw usage_error("--refresh: needs --cache dual");
  require(o.pd_width >= 1 && o.pd_width <= 60, "--pd-width", "must be in [1, 60]");
  require(o.pd_depth >= 1, "--pd-depth", "must be >= 1");
  if (o.no_pd && (o.has("--pd-width") || o.has("--pd-depth") || o.has("--pd-first-path")))
    throw usage_error(std::string(o.has("--pd-width")   ? "--pd-width"
                                  : o.has("--pd-depth") ? "--pd-depth"
                                                        : "--pd-first-path") +
                      ": not used with --no-pd");

  // Cool-SD.
  require(o.cool_schedule == "uniform" || o.cool_schedule == "exponential" ||
              o.cool_schedule == "linear",
          "--cool-schedule",
          "must be uniform, exponential or linear, got '" + o.cool_schedule + "'");
  require(o.delta > 0.0, "--delta", "must be > 0");
  require(o.nu >= 0.0, "--nu", "must be >= 0");
  require(o.ell >= 2.0, "--ell", "must be >= 2");
  if (o.has("--nu") && o.cool_schedule != "exponential")
    throw usage_error("--nu: only used with --cool-schedule exponential");
  if (o.has("--ell") && o.cool_schedule != "linear")
    throw usage_error("--ell: only used with --cool-schedule linear");
  if (o.method == "lantern")
    require(o.resampling == "optimal" || o.resampling == "vanilla" || o.resampling == "lantern" ||
                o.resampling == "lantern-official",
            "--resampling",
            "must be optimal, vanilla, lantern or lantern-official for method lantern, got '" +
                o.resampling + "'");
  else
    require(o.resampling == "optimal" || o.resampling == "vanilla", "--resampling",
            "must be optimal or vanilla, got '" + o.resampling + "'");

  // LANTERN++ (the codebook's size bounds k once the model is read).
  require(o.lambda >= 0.0, "--lambda", "must be >= 0 (the cap is lambda * p(x))");
  require(o.lantern_k >= 1, "--lantern-k", "must be >= 1");

  require(o.backend == "specula" || o.backend == "llama.cpp", "--backend",
          "must be specula or llama.cpp, got '" + o.backend + "'");
  require(o.backend == "specula" || o.device == "cpu", "--device",
          "cuda runs the example backend's models (not with --backend llama.cpp)");
  if (o.backend == "llama.cpp") {
#if !defined(SPECULA_DEMO_LLAMA_CPP)
    throw usage_error(
        "--backend: this specula_demo was built without llama.cpp (configure with "
        "-DSPECULA_WITH_LLAMA_CPP=ON)");
#endif
    require(o.task == task_kind::text, "--backend", "llama.cpp runs the text task only");
    require(o.cfg == 1.0, "--backend", "llama.cpp: no --cfg");
  }
  if (o.has("--model") && o.task != task_kind::text)
    throw usage_error("--model: only used by task text (image: --image-model)");
  if (o.task == task_kind::text) {
    require(o.text_model == "text-target" || o.text_model == "text-target-jf" ||
                o.text_model == "text-target-xl",
            "--model",
            "must be text-target, text-target-jf or text-target-xl, got '" + o.text_model + "'");
    if (o.draft_model.empty()) o.draft_model = "text-draft";
    require(o.draft_model == "text-draft" ||
                (o.draft_model == "text-target" && o.text_model == "text-target-xl"),
            "--draft-model",
            "must be text-draft, or text-target with --model text-target-xl, got '" +
                o.draft_model + "'");
    require(!o.prompt.empty(), "--prompt", "must not be empty");
    if (o.max_new_tokens < 0) o.max_new_tokens = 128;
  } else if (o.task == task_kind::image) {
    if (o.has("--draft-model"))
      throw usage_error("--draft-model: only used by task text (image: image-draft)");
    o.draft_model = "image-draft";
    require(o.image_model == "image-ar-256" || o.image_model == "image-ar", "--image-model",
            "must be image-ar-256 or image-ar, got '" + o.image_model + "'");
    // The whole grid, checked (and the default filled in) once the model's layout is read.
    if (o.max_new_tokens < 0) return;
  } else {
    if (!o.has("--prompt")) o.prompt = default_diffusion_prompt;
    require(!o.prompt.empty(), "--prompt", "must not be empty");
    if (o.max_new_tokens < 0) o.max_new_tokens = 64;
  }
  require(o.max_new_tokens >= 1, "--max-new-tokens", "must be >= 1");
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

/// Loads a shipped model with the backend's default kernel and best instruction set, on
/// `threads` threads (0: one per hardware thread).
ex::transformer load_model(const std::filesystem::path& dir, const std::string& name,
                           index_t threads) {
  const auto path = dir / (name + ".safetensors");
  if (!std::filesystem::exists(path))
    throw std::runtime_error("model file " + path.string() +
                             " not found (--models-dir: the directory of the shipped models)");
  return ex::transformer::load(
      path, ex::backend_options{ex::transformer::default_kernel(), ex::best_cpu_isa(),
                                static_cast<int>(threads)});
}

/// The image class of --label: an index, a class name, or -1 (the null label).
index_t resolve_label(const std::string& label, const ex::vq_codebook& vq) {
  const auto& classes = vq.classes();
  for (std::size_t c = 0; c < classes.size(); ++c)
    if (classes[c] == label) return static_cast<index_t>(c);
  std::string names;
  for (std::size_t c = 0; c < classes.size(); ++c)
    names += (c == 0 ? "" : ", ") + std::to_string(c) + " " + classes[c];
  index_t c = 0;
  try {
    c = parse_int("--label", label);
  } catch (const usage_error&) {
    throw usage_error("--label: unknown class '" + label + "' (" + names + ", or -1 for none)");
  }
  require(
      c >= -1 && c < static_cast<index_t>(classes.size()), "--label",
      "must be in [-1, " + std::to_string(classes.size() - 1) + "] (" + names + "), got " + label);
  return c;
}

struct sample_result {
  std::vector<token_t> tokens;
  decode_stats stats;
  double wall_seconds = 0.0;
  std::string image_path, heat_path;
};

std::string as_text(std::span<const token_t> tokens) {
  std::string s;
  for (const token_t t : tokens) s.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  return s;
}

json stats_json(const decode_stats& st, double wall_seconds) {
  return {{"tokens", st.tokens},
          {"steps", st.steps},
          {"target_forwards", st.target_forwards},
          {"draft_forwards", st.draft_forwards},
          {"forward_seconds", st.forward_seconds},
          {"verify_seconds", st.verify_seconds},
          {"draft_seconds", st.draft_seconds},
          {"wall_seconds", wall_seconds},
          {"accepted_histogram", st.accepted_histogram},
          {"mean_accepted", st.mean_accepted()},
          {"step_compression", st.step_compression()}};
}

int run(int argc, char** argv) {
  demo_options o = parse_args(argc, argv);
  const method_entry& method = find_method(o);
  resolve(o, method);
  if ((method.pending & mask_of(o.task)) != 0)
    throw not_available("method " + o.method + " is not available yet for task " +
                        task_name(o.task));

  // Models.
  const auto t_load = std::chrono::steady_clock::now();
  std::optional<ex::transformer> model, draft;
  std::optional<ex::vq_codebook> vq;
  std::optional<specula::neighbour_table> neighbours;
  std::vector<token_t> prompt;
  index_t vocab_limit = 0;
  index_t image_width = 0;
  token_t null_label = -1;
  index_t label = -2;
  if (o.task == task_kind::text) {
    model.emplace(load_model(o.models_dir, o.text_model, o.threads));
    if (o.method == "sd" || o.method == "cool-sd")
      draft.emplace(load_model(o.models_dir, o.draft_model, o.threads));
    for (const char c : o.prompt)
      prompt.push_back(static_cast<token_t>(static_cast<unsigned char>(c)));
    const auto limit = model->config().max_seq_len;
    require(static_cast<index_t>(prompt.size()) + o.max_new_tokens <= limit, "--max-new-tokens",
            "prompt (" + std::to_string(prompt.size()) +
                " bytes) + new tokens must fit the model's " + std::to_string(limit) +
                " positions");
    vocab_limit = model->vocab_size();
  } else if (o.task == task_kind::image) {
    model.emplace(load_model(o.models_dir, o.image_model, o.threads));
    const auto vq_path = o.models_dir / "image-vq.safetensors";
    if (!std::filesystem::exists(vq_path))
      throw std::runtime_error("codebook " + vq_path.string() + " not found (--models-dir)");
    // The codebook in the model's layout (image-ar-256: the same patches on a 16x16 grid).
    vq.emplace(ex::vq_codebook::load(vq_path, o.models_dir / (o.image_model + ".safetensors")));
    label = resolve_label(o.label, *vq);
    null_label = vq->label_token(-1);
    prompt.push_back(vq->label_token(label));
    vocab_limit = vq->codes();
    image_width = vq->grid();
    if (o.max_new_tokens < 0) o.max_new_tokens = vq->tokens_per_image();
    if (o.method == "sd" || o.method == "cool-sd" || o.method == "lantern") {
      require(o.image_model == "image-ar-256", "--image-model",
              "method " + o.method + " drafts with image-draft, the draft model of image-ar-256; " +
                  o.image_model + " has none");
      draft.emplace(load_model(o.models_dir, "image-draft", o.threads));
    }
    if (o.method == "lantern") {
      require(o.lantern_k <= vq->codes() - 1, "--lantern-k",
              "must be in [1, " + std::to_string(vq->codes() - 1) + "] (the other codes), got " +
                  std::to_string(o.lantern_k));
      neighbours.emplace(image_neighbours(*vq, model->vocab_size(), o.lantern_k));
    }
    require(o.max_new_tokens == vq->tokens_per_image(), "--max-new-tokens",
            "the image task generates exactly " + std::to_string(vq->tokens_per_image()) +
                " tokens with " + o.image_model + " (the " + std::to_string(vq->grid()) + "x" +
                std::to_string(vq->grid()) + " grid), got " + std::to_string(o.max_new_tokens));
  } else {
    model.emplace(load_model(o.models_dir, "text-diffusion", o.threads));
    for (const char c : o.prompt)
      prompt.push_back(static_cast<token_t>(static_cast<unsigned char>(c)));
    const auto limit = model->config().max_seq_len;
    require(static_cast<index_t>(prompt.size()) + o.max_new_tokens <= limit, "--max-new-tokens",
            "prompt (" + std::to_string(prompt.size()) +
                " bytes) + new tokens must fit the model's " + std::to_string(limit) +
                " positions");
    vocab_limit = model->vocab_size();
  }
  // --backend llama.cpp: the same models as GGUF (tools/to_gguf.py) in llama.cpp contexts with
  // the settings exactness needs (F32 cache, flash attention off) and the same threads.
  std::optional<llama_session> llama_target, llama_draft;
#if defined(SPECULA_DEMO_LLAMA_CPP)
  if (o.backend == "llama.cpp") {
    ex::llama_model_options lo;
    lo.max_leaves = 256;  // SJD-PAC's windows with proactive drafts have many leaves
    lo.threads = o.threads > 0
                     ? static_cast<int>(o.threads)
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const auto gguf = [&](const std::string& name) {
      const auto path = o.gguf_dir / (name + ".gguf");
      if (!std::filesystem::exists(path))
        throw std::runtime_error(path.string() +
                                 " not found (--gguf-dir: tools/to_gguf.py --all DIR)");
      return path;
    };
    llama_target.emplace(gguf(o.text_model), lo);
    if (draft) llama_draft.emplace(gguf(o.draft_model), lo);
  }
#endif
  // --device cuda: the same weights on the GPU.
  std::optional<device_model> device, device_draft;
#ifdef SPECULA_DEMO_CUDA
  if (o.device == "cuda") {
    device.emplace(model->weights());
    if (draft) device_draft.emplace(draft->weights());
    // The image task's rows are restricted to image tokens on the GPU itself.
    if (vocab_limit < model->vocab_size()) {
      device->set_vocab_limit(vocab_limit);
      if (device_draft) device_draft->set_vocab_limit(vocab_limit);
    }
    if (!o.quiet && !resident_loop(o))
      std::fprintf(stderr,
                   "[specula_demo] --method %s runs with the non-resident path on the GPU "
                   "(device_session: the host's loop, logits copied to the host each pass): %s\n",
                   o.method.c_str(), non_resident_reason(o).c_str());
  }
#endif
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  // Decode.
  progress_line progress(!o.quiet && isatty(STDERR_FILENO) != 0);
  auto input = [&](index_t stream, progress_line* shown) {
    return run_input{o,
                     *model,
                     draft ? &*draft : nullptr,
                     device ? &*device : nullptr,
                     device_draft ? &*device_draft : nullptr,
                     neighbours ? &*neighbours : nullptr,
                     prompt,
                     vocab_limit,
                     image_width,
                     null_label,
                     specula::request_rng{o.seed, static_cast<std::uint32_t>(stream), 0},
                     shown,
                     llama_target ? &*llama_target : nullptr,
                     llama_draft ? &*llama_draft : nullptr};
  };
  // Warm-up: whole requests, untimed and unreported, on streams after the timed requests' (so
  // the timed tokens are those of a run without warm-up).
  for (index_t i = 0; i < o.warmup; ++i) {
    decode_stats ignored;
    (void)method.run(input(o.num_samples + i, nullptr), ignored);
  }
  std::vector<sample_result> results(static_cast<std::size_t>(o.num_samples));
  decode_stats total;
  double wall = 0.0;
  for (index_t i = 0; i < o.num_samples; ++i) {
    sample_result& r = results[static_cast<std::size_t>(i)];
    progress.begin(i, o.num_samples, o.max_new_tokens);
    const run_input in = input(i, &progress);
    const auto t0 = std::chrono::steady_clock::now();
    r.tokens = method.run(in, r.stats);
    r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wall += r.wall_seconds;
    total.merge(r.stats);
  }
  progress.finish();

  // Images and heat maps.
  index_t heat_max = 2;
  for (const index_t k : total.step_tokens) heat_max = std::max(heat_max, k);
  if (o.task == task_kind::image) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec)
      throw std::runtime_error("--out-dir: cannot create " + o.out_dir.string() + ": " +
                               ec.message());
    const index_t n = vq->image_size();
    const index_t cell = n / vq->grid() * o.scale;
    for (std::size_t i = 0; i < results.size(); ++i) {
      sample_result& r = results[i];
      if (static_cast<index_t>(r.tokens.size()) != vq->tokens_per_image())
        throw std::runtime_error("sample " + std::to_string(i) + ": " +
                                 std::to_string(r.tokens.size()) + " tokens, not a whole image");
      specula_demo::rgb8_image img(n, n);
      img.pixels = vq->decode_rgb8(r.tokens);
      const auto stem = o.out_dir / (o.method + "_" + std::to_string(i));
      r.image_path = stem.string() + ".png";
      r.heat_path = stem.string() + "_heat.png";
      specula_demo::write_png(r.image_path, specula_demo::upscale_nearest(img, o.scale));
      const auto sizes =
          specula_demo::per_token_step_sizes(r.stats.step_tokens, vq->tokens_per_image());
      specula_demo::write_png(r.heat_path,
                              specula_demo::acceptance_heatmap(sizes, vq->grid(), cell, heat_max));
    }
  }

  // Report.
  json params = method.params(o);
  params["seed"] = o.seed;
  params["max_new_tokens"] = o.max_new_tokens;
  params["num_samples"] = o.num_samples;
  params["warmup"] = o.warmup;
  params["threads"] = model->options().threads;
  params["kernel"] = model->kernel() == ex::matmul_kernel::builtin ? "builtin" : "blas";
  params["backend"] = o.backend;
  if (o.device == "cuda") {
    params["resident"] = resident_loop(o);
    if (!resident_loop(o)) params["non_resident_reason"] = non_resident_reason(o);
  }
  if (o.task == task_kind::image) {
    params["model"] = o.image_model;
    params["label"] = label;
    params["class"] = label >= 0 ? vq->classes()[static_cast<std::size_t>(label)] : "none";
    params["scale"] = o.scale;
  }

  if (o.json_output) {
    json j = {{"task", task_name(o.task)},
              {"method", o.method},
              {"device", o.device},
              {"parameters", params}};
    j.update(stats_json(total, wall));
    j["load_seconds"] = load_seconds;
    j["tokens_per_second"] = wall > 0.0 ? static_cast<double>(total.tokens) / wall : 0.0;
    json samples = json::array();
    for (std::size_t i = 0; i < results.size(); ++i) {
      const sample_result& r = results[i];
      json s = {{"index", i}};
      s.update(stats_json(r.stats, r.wall_seconds));
      s["step_tokens"] = r.stats.step_tokens;
      if (o.task == task_kind::image) {
        s["image"] = r.image_path;
        s["heatmap"] = r.heat_path;
        s["image_tokens"] = r.tokens;
      } else {
        s["text"] = as_text(r.tokens);
      }
      samples.push_back(std::move(s));
    }
    if (o.task != task_kind::image) {
      j["prompt"] = o.prompt;
      j["text"] = as_text(results.front().tokens);
    }
    j["samples"] = std::move(samples);
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }

  std::printf("task %s, method %s: %lld sample(s), %lld new tokens each, seed %llu\n",
              task_name(o.task), o.method.c_str(), static_cast<long long>(o.num_samples),
              static_cast<long long>(o.max_new_tokens), static_cast<unsigned long long>(o.seed));
  std::string plist;
  const json method_params = method.params(o);
  for (const auto& [key, value] : method_params.items())
    plist += (plist.empty() ? "" : ", ") + key + " " +
             (value.is_string() ? value.get<std::string>() : value.dump());
  if (!plist.empty()) std::printf("parameters: %s\n", plist.c_str());
  std::printf("tokens %lld, steps %lld, target forwards %lld, draft forwards %lld\n",
              static_cast<long long>(total.tokens), static_cast<long long>(total.steps),
              static_cast<long long>(total.target_forwards),
              static_cast<long long>(total.draft_forwards));
  std::printf("step compression %.3f tokens per step (mean accepted drafts %.3f)\n",
              total.step_compression(), total.mean_accepted());
  std::printf(
      "time: decode %.1f ms (forward %.1f, verify %.1f, draft %.1f), %.0f tokens/s; "
      "model load %.1f ms\n",
      1e3 * wall, 1e3 * total.forward_seconds, 1e3 * total.verify_seconds,
      1e3 * total.draft_seconds, wall > 0.0 ? static_cast<double>(total.tokens) / wall : 0.0,
      1e3 * load_seconds);
  std::printf("accepted drafts per step (k: steps):");
  for (std::size_t k = 0; k < total.accepted_histogram.size(); ++k)
    if (total.accepted_histogram[k] > 0)
      std::printf(" %zu: %lld", k, static_cast<long long>(total.accepted_histogram[k]));
  std::printf("\n");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const sample_result& r = results[i];
    std::printf("\n--- sample %zu: %lld tokens, %lld steps, step compression %.3f ---\n", i,
                static_cast<long long>(r.stats.tokens), static_cast<long long>(r.stats.steps),
                r.stats.step_compression());
    if (o.task == task_kind::image) {
      std::printf("class %s; image %s; heat map %s\n", params["class"].get<std::string>().c_str(),
                  r.image_path.c_str(), r.heat_path.c_str());
      std::printf("tokens emitted by the step of each cell:\n");
      const auto sizes =
          specula_demo::per_token_step_sizes(r.stats.step_tokens, vq->tokens_per_image());
      for (index_t y = 0; y < vq->grid(); ++y) {
        std::printf(" ");
        for (index_t x = 0; x < vq->grid(); ++x)
          std::printf(" %2lld",
                      static_cast<long long>(sizes[static_cast<std::size_t>(y * vq->grid() + x)]));
        std::printf("\n");
      }
    } else {
      std::printf("%s%s\n", o.prompt.c_str(), as_text(r.tokens).c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "specula_demo: %s\n(specula_demo --help lists the arguments)\n", e.what());
    return exit_bad_arguments;
  } catch (const not_available& e) {
    std::fprintf(stderr, "specula_demo: %s\n", e.what());
    return exit_not_available;
  } catch (const specula::invalid_input& e) {
    // A parameter the library refused: name the command-line flag it came from.
    static const std::map<std::string, std::string> flags = {{"pd_depth", "--pd-depth"},
                                                             {"pd_width", "--pd-width"},
                                                             {"window", "--window"},
                                                             {"draft_length", "--draft-length"},
                                                             {"max_new_tokens", "--max-new-tokens"},
                                                             {"temperature", "--temperature"},
                                                             {"top_k", "--top-k"},
                                                             {"top_p", "--top-p"},
                                                             {"delta", "--delta"},
                                                             {"nu", "--nu"},
                                                             {"ell", "--ell"},
                                                             {"class", "--label"}};
    const auto it = flags.find(e.argument());
    std::fprintf(stderr, "specula_demo: %s%s%s\n", it != flags.end() ? it->second.c_str() : "",
                 it != flags.end() ? ": " : "invalid parameter: ", e.what());
    return exit_bad_arguments;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specula_demo: error: %s\n", e.what());
    return exit_runtime_error;
  }
}
