// libFuzzer target: the decoding loops under a fuzzed fault schedule, on fuzzed toy models.
//
// The input picks a loop (SD chain / tree / greedy, SJD, SJD-PAC, Jacobi, multi-block greedy
// and stochastic, autoregressive, SD with the n-gram proposal), a toy target and draft model
// (vocabulary, horizon, seeds), the target plain or under classifier-free guidance (cfg_model
// over a conditional and an unconditional stream per request), one request or a batch of up
// to 4 (with or without isolation, per-request stop-token lists, a cancellation, a cancel
// callback that throws), a token budget and up to four faults (kind, call, row, column, which
// model, request and stream, transient or sticky). Whatever happens, the loop must either
// finish or throw specula::decode_error (bad arguments: invalid_input), and then: every
// reported token is in range and the committed tokens are a prefix of the clean run's output;
// every model whose caches are reported consistent holds its request's committed sequence (the
// target all of it but the last token — under CFG both streams, the unconditional one after
// its own prompt — a draft a prefix of it); with isolation, every request that did not fail
// equals the clean run.
//
// Or it picks a masked (diffusion) model's loop, stepwise decoding or SSD (block size, draft
// length, tree, fallback), one request (with a cancel callback) or a batch, and faults of the
// masked model (an exception, a NaN / +inf logit, a row of -inf): every request's reported
// sequence holds the clean run's token wherever it is not the mask token; with isolation,
// every request that completed equals the clean run.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include "specula/decode/autoregressive.hpp"
#include "specula/decode/batch.hpp"
#include "specula/decode/cfg.hpp"
#include "specula/decode/jacobi.hpp"
#include "specula/decode/lookup.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula/decode/sjd.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/ssd.hpp"
#include "specula/testing/faulty_model.hpp"
#include "specula/testing/toy_models.hpp"

namespace {

using namespace specula;
using testing::fault_kind;
using testing::fault_plan;
using fsession = testing::faulty_session<testing::toy_model_session>;
using fbatch = session_batch<fsession>;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

struct input {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t at = 0;
  std::uint8_t next() { return at < size ? data[at++] : 0; }
};

// Loops 0-9 run on toy autoregressive models, 10 and 11 (stepwise, SSD) on a masked model.
constexpr int ar_loops = 10;
constexpr int loops = 12;

template <class T, class D>
std::vector<std::vector<token_t>> run(int loop, T& target, D& draft,
                                      std::span<const std::vector<token_t>> prompts, index_t n,
                                      std::span<const request_rng> rngs,
                                      const batch_control& control) {
  speculative_options so;
  so.draft_length = 3;
  so.max_new_tokens = n;
  if (loop == 1) so.draft_tree = trees::full(2, 2);
  if (loop == 2) so.mode = draft_mode::greedy;
  sjd_options sj;
  sj.window = 4;
  sj.max_new_tokens = n;
  sj.adaptive_continuation = sj.proactive_drafting = loop == 4;
  sj.pd_width = 2;
  jacobi_options jo;
  jo.window = 3;
  jo.max_new_tokens = n;
  multiblock_options mo;
  mo.block_size = 3;
  mo.max_blocks = 2;
  mo.max_new_tokens = n;
  mo.stochastic = loop == 7;
  mo.recycling = loop == 6;
  autoregressive_options ao;
  ao.max_new_tokens = n;
  ao.greedy = true;
  switch (loop) {
    case 0:
    case 1:
      return speculative_decode_batch(target, draft, prompts, so, rngs, tree_verifier<>{}, {},
                                      control);
    case 2:
      return speculative_decode_batch(target, draft, prompts, so, rngs, greedy_tree_verifier<>{},
                                      {}, control);
    case 3:
    case 4:
      return sjd_decode_batch(target, prompts, sj, rngs, tree_verifier<>{}, {}, control);
    case 5:
      return jacobi_decode_batch(target, prompts, jo, rngs, {}, control);
    case 8:
      return autoregressive_decode_batch(target, prompts, ao, rngs, {}, control);
    case 9: {
      std::vector<ngram_proposal> proposals(prompts.size(),
                                            ngram_proposal(ngram_options{1, 2, 3, 2}));
      return speculative_decode_batch(target, std::span<ngram_proposal>(proposals), prompts, so,
                                      rngs, tree_verifier<>{}, {}, control);
    }
    default:
      return multiblock_decode_batch(target, prompts, mo, rngs, tree_verifier<>{}, {}, control);
  }
}

bool is_prefix(std::span<const token_t> a, std::span<const token_t> b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void check_cache(const fsession& m, std::span<const token_t> seq, bool draft) {
  const auto ctx = m.inner().context();
  require(draft ? ctx.size() <= seq.size() : ctx.size() + 1 == seq.size());
  require(std::equal(ctx.begin(), ctx.end(), seq.begin()));
}

/// CFG's unconditional prompt: the prompt with a null token (0) in front.
std::vector<token_t> uncond_of(std::span<const token_t> p) {
  std::vector<token_t> u{0};
  u.insert(u.end(), p.begin(), p.end());
  return u;
}

/// The target of a run: `inner` (B sessions) as it is, or, under CFG, a cfg_model over it
/// (2 B sessions: request r's conditional stream r, its unconditional one r + B).
struct target_models {
  fbatch inner;
  std::optional<cfg_model<fbatch>> guided;
  target_models(const testing::toy_ar_model& law, std::size_t b, bool cfg)
      : inner(std::vector<fsession>(cfg ? 2 * b : b, fsession{testing::toy_model_session(law)})) {
    if (cfg) guided.emplace(inner, 1.5f, uncond_of);
  }
  target_models(const target_models&) = delete;
  target_models& operator=(const target_models&) = delete;
  template <class F>
  decltype(auto) with(F&& f) {
    return guided ? f(*guided) : f(inner);
  }
};

/// A masked model's loop (stepwise or SSD) under faults (see file comment).
int fuzz_masked(bool ssd, input& in) {
  using fmasked = testing::faulty_masked<testing::toy_masked_model>;
  const index_t V = 3 + in.next() % 4;  // the mask token is V - 1
  const std::uint64_t seed = in.next();
  const auto B = static_cast<std::size_t>(1 + in.next() % 3);
  const std::uint8_t flags = in.next();
  const bool isolate = (flags & 1) != 0;
  const bool cancel_one = (flags & 2) != 0;
  const bool cancel_throws = (flags & 8) != 0;
  const bool solo = (flags & 16) != 0;
  ssd_options o;
  o.gen_length = 1 + in.next() % 8;
  o.block_size = 1 + in.next() % 4;
  o.draft_length = 1 + in.next() % 3;
  o.tree = (flags & 32) != 0 ? ssd_tree::mix_order : ssd_tree::chain;
  o.fallback = (flags & 64) != 0;
  std::vector<std::vector<token_t>> prompts(solo ? 1 : B);
  for (auto& p : prompts) {
    const std::uint8_t len = 1 + in.next() % 3;
    for (std::uint8_t i = 0; i < len; ++i) p.push_back(in.next() % (V - 1));
  }
  const testing::toy_masked_model law(V, seed);
  const auto decode = [&](const fmasked& m, const batch_control& c) {
    return ssd ? ssd_decode_batch(m, prompts, o, {}, c)
               : diffusion_stepwise_decode_batch(m, prompts, o, {}, c);
  };
  const auto clean = decode(fmasked{law}, batch_control{});
  const auto kind = static_cast<fault_kind>(1 + in.next() % 4);  // throws, NaN, +inf, empty row
  fault_plan plan{kind, 1 + in.next() % 12, in.next() % 16, in.next() % 8, false};
  plan.sticky = (in.next() & 1) != 0;
  const fmasked m{law, in.at < in.size ? plan : fault_plan{}};
  // The reported sequence of request r: the clean run's token wherever it is not the mask.
  const auto check_partial = [&](const std::vector<token_t>& got, std::size_t r) {
    require(got.size() == clean[r].size());
    for (std::size_t i = 0; i < got.size(); ++i)
      require(got[i] == law.mask_token() || got[i] == clean[r][i]);
  };
  if (solo) {
    request_status status = request_status::not_run;
    request_control control;
    control.status = &status;
    if (cancel_one || cancel_throws)
      control.cancel = [&] {
        if (cancel_throws && m.evaluates() >= 2) throw std::runtime_error("cancel callback fault");
        return cancel_one && m.evaluates() >= 1;
      };
    std::vector<token_t> got;
    try {
      got = ssd ? ssd_decode(m, prompts[0], o, nullptr, control)
                : diffusion_stepwise_decode(m, prompts[0], o, nullptr, control);
      require(status == request_status::completed || status == request_status::cancelled);
      if (status == request_status::completed) require(got == clean[0]);
    } catch (const decode_error& e) {
      require(status == request_status::failed);
      require(e.caches_consistent());
      got = e.committed().at(0);
    }
    check_partial(got, 0);
    return 0;
  }
  std::vector<request_outcome> outcomes(B);
  batch_control control;
  control.isolate = isolate;
  control.outcomes = outcomes;
  if (cancel_one || cancel_throws)
    control.cancel = [&](index_t r) {
      if (cancel_throws && r == static_cast<index_t>(B - 1) && m.evaluates() >= 2)
        throw std::runtime_error("cancel callback fault");
      return cancel_one && r == 0 && m.evaluates() >= 1;
    };
  std::vector<std::vector<token_t>> got;
  try {
    got = decode(m, control);
  } catch (const decode_error& e) {
    require(!isolate);  // with isolation a fault drops its request, the call returns
    got = e.committed();
  }
  require(got.size() == B);
  for (std::size_t r = 0; r < B; ++r) {
    check_partial(got[r], r);
    if (outcomes[r].status == request_status::completed) require(got[r] == clean[r]);
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in{data, size};
  const int loop = in.next() % loops;
  if (loop >= ar_loops) return fuzz_masked(loop == ar_loops + 1, in);
  const bool sd = loop <= 2;
  const index_t V = 2 + in.next() % 4;
  const index_t horizon = 2 + in.next() % 4;
  const std::uint64_t seed = in.next();
  const auto B = static_cast<std::size_t>(1 + in.next() % 4);
  const std::uint8_t flags = in.next();
  const bool isolate = (flags & 1) != 0;
  const bool cancel_one = (flags & 2) != 0;
  const bool stop_lists = (flags & 4) != 0;
  const bool cancel_throws = (flags & 8) != 0;
  const bool cfg = (flags & 16) != 0;
  const index_t n = 1 + in.next() % 8;
  // Under CFG the target has no zero probabilities (mixing two -inf logits gives NaN).
  const testing::toy_ar_model target_law(V, horizon, seed, cfg ? 0.0 : 0.3);
  const auto draft_law = testing::toy_ar_model::perturbed(target_law, 0.5, seed + 1);

  std::vector<std::vector<token_t>> prompts(B);
  std::vector<request_rng> rngs;
  for (std::size_t r = 0; r < B; ++r) {
    prompts[r].push_back(0);
    const std::uint8_t extra = in.next() % 3;
    for (std::uint8_t i = 0; i < extra; ++i) prompts[r].push_back(in.next() % V);
    rngs.push_back({seed + r, static_cast<std::uint32_t>(r), 0});
  }
  const auto make_draft = [&] {
    return fbatch(std::vector<fsession>(B, fsession{testing::toy_model_session(draft_law)}));
  };
  // Per-request stop-token lists (the clean run has the same).
  std::vector<request_limits> limits(stop_lists ? B : 0);
  for (std::size_t r = 0; r < limits.size(); ++r) {
    limits[r].stop_tokens = std::vector<token_t>{static_cast<token_t>((seed + r) % V)};
    if (r % 2 == 1) limits[r].stop_tokens->push_back(static_cast<token_t>((seed + 2 * r) % V));
  }
  batch_control clean_control;
  clean_control.limits = limits;
  target_models clean_t(target_law, B, cfg);
  fbatch clean_d = make_draft();
  const auto clean =
      clean_t.with([&](auto& t) { return run(loop, t, clean_d, prompts, n, rngs, clean_control); });

  target_models target(target_law, B, cfg);
  fbatch draft = make_draft();
  std::vector<bool> faulty(B, false);
  for (int f = 0; f < 4 && in.at < in.size; ++f) {
    const auto kind = static_cast<fault_kind>(in.next() % testing::fault_kind_count);
    fault_plan plan{kind, 1 + in.next() % 24, in.next() % 16, in.next() % 8, false};
    const std::uint8_t where = in.next();
    plan.sticky = (where & 0x80) != 0;
    const auto r = static_cast<index_t>(where % B);
    const bool on_draft = sd && (where & 0x40) != 0;
    const bool uncond_stream = cfg && !on_draft && (where & 0x20) != 0;
    (on_draft ? draft : target.inner)
        .session(uncond_stream ? r + static_cast<index_t>(B) : r)
        .plan() = plan;
    faulty[static_cast<std::size_t>(r)] = true;
  }

  std::vector<request_outcome> outcomes(B);
  batch_control control;
  control.isolate = isolate;
  control.outcomes = outcomes;
  control.limits = limits;
  const auto last = static_cast<index_t>(B - 1);
  if (cancel_throws) faulty[B - 1] = true;
  if (cancel_one || cancel_throws)
    control.cancel = [&](index_t r) {
      if (cancel_throws && r == last && target.inner.session(last).evaluates() >= 3)
        throw std::runtime_error("cancel callback fault");
      return cancel_one && r == 0 && target.inner.session(0).evaluates() >= 2;
    };
  std::vector<std::vector<token_t>> committed;
  bool consistent = true;
  try {
    committed =
        target.with([&](auto& t) { return run(loop, t, draft, prompts, n, rngs, control); });
  } catch (const decode_error& e) {
    committed = e.committed();
    consistent = e.caches_consistent();
  } catch (const invalid_input&) {
    return 0;  // e.g. a vocab_size fault at the first call: refused as an argument
  }
  require(committed.size() == B);
  for (std::size_t r = 0; r < B; ++r) {
    for (const token_t t : committed[r]) require(t >= 0 && t < V);
    require(is_prefix(committed[r], clean[r]));
    if (isolate && !faulty[r] && !(cancel_one && r == 0) &&
        outcomes[r].status == request_status::completed)
      require(committed[r] == clean[r]);
    if (outcomes[r].status == request_status::failed && outcomes[r].error) {
      try {
        std::rethrow_exception(outcomes[r].error);
      } catch (const decode_error& e) {
        if (!e.caches_consistent()) continue;
      }
    }
    if (!consistent || outcomes[r].status == request_status::not_run) continue;
    std::vector<token_t> seq = prompts[r];
    seq.insert(seq.end(), committed[r].begin(), committed[r].end());
    check_cache(target.inner.session(static_cast<index_t>(r)), seq, false);
    if (cfg) {
      std::vector<token_t> useq = uncond_of(prompts[r]);
      useq.insert(useq.end(), committed[r].begin(), committed[r].end());
      check_cache(target.inner.session(static_cast<index_t>(r + B)), useq, false);
    }
    if (sd) check_cache(draft.session(static_cast<index_t>(r)), seq, true);
  }
  return 0;
}
