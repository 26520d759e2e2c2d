// Decoding loops under faults (docs/decoding.md, "Faults"): a model that throws, returns a
// non-finite or empty row, ignores or fails a commit, fails a rollback or changes its vocabulary
// at any of its passes. For every loop (SD chain / tree / greedy, Cool-SD, SJD, SJD-PAC,
// Jacobi, multi-block greedy and stochastic, autoregressive, SD with the n-gram proposal, SSD;
// alone, batched, under CFG):
// - the loop throws decode_error naming the request, the model, the operation (and the row
//   and column of a bad logit);
// - the committed tokens it reports are a prefix of the uninterrupted run's output, and every
//   model's cache equals them (checked against a fresh model prefilled with them: same
//   context, same row for the next root);
// - resuming from them gives the uninterrupted greedy output, or the target's law (G-tests,
//   with a control that resumes from a corrupted token and must fail);
// - batched with isolation, a faulty request is dropped and the others' outputs equal a run
//   without the fault (under CFG too: a batch without the faulty request); resuming the
//   faulted requests of a batch keeps the target's law (G-test with a control);
// - cancellation before the first pass and between steps, a throwing cancel callback (one
//   request and batched);
//   per-request limits and stop-token lists; bad controls and limits are refused, naming the
//   request and index, before any model is touched;
// - SSD and stepwise diffusion decoding, uncached and through the dual cache.
// Models are faulty_session / faulty_masked wrappers around the toy models.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <specula/decode/autoregressive.hpp>
#include <specula/decode/batch.hpp>
#include <specula/decode/cfg.hpp>
#include <specula/decode/jacobi.hpp>
#include <specula/decode/lookup.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/decode/ssd.hpp>
#include <specula/rules/relaxed.hpp>
#include <specula/testing/faulty_model.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using decode_testing::rngs_for;
using specula::testing::fault_kind;
using specula::testing::fault_plan;
using specula::testing::faulty_masked;
using specula::testing::faulty_session;
using specula::testing::toy_ar_model;
using specula::testing::toy_masked_model;
using specula::testing::toy_model_session;

namespace {

using fsession = faulty_session<toy_model_session>;
using fbatch = session_batch<fsession>;

enum class loop_id {
  sd_chain,
  sd_tree,
  sd_greedy,
  cool_sd,
  sjd,
  sjd_pac,
  jacobi,
  multiblock,
  multiblock_stochastic,
  autoregressive,  ///< greedy
  lookup,          ///< SD with the n-gram proposal as the draft (no draft model)
};
constexpr loop_id all_loops[] = {
    loop_id::sd_chain,       loop_id::sd_tree,    loop_id::sd_greedy,
    loop_id::cool_sd,        loop_id::sjd,        loop_id::sjd_pac,
    loop_id::jacobi,         loop_id::multiblock, loop_id::multiblock_stochastic,
    loop_id::autoregressive, loop_id::lookup};

const char* name_of(loop_id id) {
  constexpr const char* names[] = {"sd_chain",       "sd_tree",    "sd_greedy",
                                   "cool_sd",        "sjd",        "sjd_pac",
                                   "jacobi",         "multiblock", "multiblock_stochastic",
                                   "autoregressive", "lookup"};
  return names[static_cast<int>(id)];
}
bool has_draft(loop_id id) { return static_cast<int>(id) <= static_cast<int>(loop_id::cool_sd); }
/// Output a function of the prompt alone (resuming gives the same tokens).
bool is_greedy(loop_id id) {
  return id == loop_id::sd_greedy || id == loop_id::jacobi || id == loop_id::multiblock ||
         id == loop_id::autoregressive;
}

speculative_options sd_options(loop_id id, index_t n, std::span<const token_t> stops = {}) {
  speculative_options o;
  o.stop_tokens.assign(stops.begin(), stops.end());
  o.draft_length = 3;
  o.max_new_tokens = n;
  if (id == loop_id::sd_tree) o.draft_tree = trees::full(2, 2);
  if (id == loop_id::sd_greedy) o.mode = draft_mode::greedy;
  return o;
}
sjd_options sjd_opts(loop_id id, index_t n, std::span<const token_t> stops = {}) {
  sjd_options o;
  o.stop_tokens.assign(stops.begin(), stops.end());
  o.window = 4;
  o.max_new_tokens = n;
  if (id == loop_id::sjd_pac) {
    o.adaptive_continuation = true;
    o.proactive_drafting = true;
    o.pd_width = 2;
  }
  return o;
}
jacobi_options jacobi_opts(index_t n, std::span<const token_t> stops = {}) {
  jacobi_options o;
  o.stop_tokens.assign(stops.begin(), stops.end());
  o.window = 3;
  o.max_new_tokens = n;
  return o;
}
multiblock_options mb_opts(loop_id id, index_t n, std::span<const token_t> stops = {}) {
  multiblock_options o;
  o.stop_tokens.assign(stops.begin(), stops.end());
  o.block_size = 3;
  o.max_blocks = 2;
  o.spawn_ratio = 0.5;
  o.max_new_tokens = n;
  o.stochastic = id == loop_id::multiblock_stochastic;
  o.recycling = !o.stochastic;
  return o;
}
autoregressive_options ar_opts(index_t n, std::span<const token_t> stops = {}) {
  autoregressive_options o;
  o.stop_tokens.assign(stops.begin(), stops.end());
  o.greedy = true;
  o.max_new_tokens = n;
  return o;
}
/// The lookup loop's proposal: a fresh n-gram index per request and call.
ngram_proposal lookup_proposal() { return ngram_proposal(ngram_options{1, 2, 3, 1}); }
using cool_verifier = tree_verifier<host::sequential_policy, scheduled_relaxed_rule>;

/// Runs loop `id` on one request (models: session_model; the draft unused by draft-free loops);
/// `stops`: the options' stop_tokens.
template <class T, class D>
std::vector<token_t> run_one(loop_id id, T& target, D& draft, std::span<const token_t> prompt,
                             index_t n, request_rng rng, std::span<const token_t> stops = {},
                             const request_control& control = {}) {
  switch (id) {
    case loop_id::sd_chain:
    case loop_id::sd_tree:
      return speculative_decode(target, draft, prompt, sd_options(id, n, stops), rng,
                                tree_verifier<>{}, nullptr, control);
    case loop_id::sd_greedy:
      return speculative_decode(target, draft, prompt, sd_options(id, n, stops), rng,
                                greedy_tree_verifier<>{}, nullptr, control);
    case loop_id::cool_sd:
      return speculative_decode(target, draft, prompt, sd_options(id, n, stops), rng,
                                cool_verifier{}, nullptr, control);
    case loop_id::sjd:
    case loop_id::sjd_pac:
      return sjd_decode(target, prompt, sjd_opts(id, n, stops), rng, tree_verifier<>{}, nullptr,
                        control);
    case loop_id::jacobi:
      return jacobi_decode(target, prompt, jacobi_opts(n, stops), rng, nullptr, control);
    case loop_id::multiblock:
    case loop_id::multiblock_stochastic:
      return multiblock_decode(target, prompt, mb_opts(id, n, stops), rng, tree_verifier<>{},
                               nullptr, control);
    case loop_id::autoregressive:
      return autoregressive_decode(target, prompt, ar_opts(n, stops), rng, nullptr, control);
    case loop_id::lookup: {
      ngram_proposal proposal = lookup_proposal();
      return speculative_decode(target, proposal, prompt, sd_options(id, n, stops), rng,
                                tree_verifier<>{}, nullptr, control);
    }
  }
  return {};
}

/// Runs loop `id` batched (models: batched_session_model).
template <class T, class D>
std::vector<std::vector<token_t>> run_many(loop_id id, T& target, D& draft,
                                           std::span<const std::vector<token_t>> prompts, index_t n,
                                           std::span<const request_rng> rngs,
                                           const batch_control& control = {},
                                           std::span<const token_t> stops = {}) {
  switch (id) {
    case loop_id::sd_chain:
    case loop_id::sd_tree:
      return speculative_decode_batch(target, draft, prompts, sd_options(id, n, stops), rngs,
                                      tree_verifier<>{}, {}, control);
    case loop_id::sd_greedy:
      return speculative_decode_batch(target, draft, prompts, sd_options(id, n, stops), rngs,
                                      greedy_tree_verifier<>{}, {}, control);
    case loop_id::cool_sd:
      return speculative_decode_batch(target, draft, prompts, sd_options(id, n, stops), rngs,
                                      cool_verifier{}, {}, control);
    case loop_id::sjd:
    case loop_id::sjd_pac:
      return sjd_decode_batch(target, prompts, sjd_opts(id, n, stops), rngs, tree_verifier<>{}, {},
                              control);
    case loop_id::jacobi:
      return jacobi_decode_batch(target, prompts, jacobi_opts(n, stops), rngs, {}, control);
    case loop_id::multiblock:
    case loop_id::multiblock_stochastic:
      return multiblock_decode_batch(target, prompts, mb_opts(id, n, stops), rngs,
                                     tree_verifier<>{}, {}, control);
    case loop_id::autoregressive:
      return autoregressive_decode_batch(target, prompts, ar_opts(n, stops), rngs, {}, control);
    case loop_id::lookup: {
      std::vector<ngram_proposal> proposals(prompts.size(), lookup_proposal());
      return speculative_decode_batch(target, std::span<ngram_proposal>(proposals), prompts,
                                      sd_options(id, n, stops), rngs, tree_verifier<>{}, {},
                                      control);
    }
  }
  return {};
}

std::vector<token_t> concat(std::span<const token_t> a, std::span<const token_t> b) {
  std::vector<token_t> s(a.begin(), a.end());
  s.insert(s.end(), b.begin(), b.end());
  return s;
}

bool is_prefix(std::span<const token_t> a, std::span<const token_t> b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

/// The invariant: `m` holds `seq` but its last token (`at_most`: a prefix of at most all of
/// it, as a draft model may), with no pending evaluation: its context equals a fresh model's
/// prefilled with that prefix, and both give the same row for the next token.
void check_cache(const toy_ar_model& law, toy_model_session& m, std::span<const token_t> seq,
                 bool at_most = false) {
  const auto ctx = m.context();
  INFO("context " << ctx.size() << ", sequence " << seq.size());
  if (at_most)
    REQUIRE(ctx.size() <= seq.size());
  else
    REQUIRE(ctx.size() + 1 == seq.size());
  REQUIRE(std::equal(ctx.begin(), ctx.end(), seq.begin()));
  if (ctx.size() == seq.size()) return;  // a draft holding everything: nothing to evaluate
  toy_model_session fresh(law);
  fresh.prefill(seq.first(ctx.size() + 1));
  const index_t V = law.vocab_size();
  const token_tree root(std::vector<index_t>{-1}, std::vector<token_t>{seq[ctx.size()]});
  std::vector<float> a(static_cast<std::size_t>(V)), b(a.size());
  m.evaluate(root, batch_view<float>(a.data(), 1, V));
  fresh.evaluate(root, batch_view<float>(b.data(), 1, V));
  CHECK(a == b);
  m.rollback(m.context_size());  // drops the evaluation again
}

struct toy_pair {
  toy_ar_model target{4, 7, 11};
  toy_ar_model draft = toy_ar_model::perturbed(target, 0.5, 12);
};
const toy_pair& toys() {
  static const toy_pair t;
  return t;
}

constexpr fault_kind row_faults[] = {fault_kind::nan_logit, fault_kind::inf_logit,
                                     fault_kind::empty_row};
constexpr fault_kind solo_faults[] = {fault_kind::evaluate_throws, fault_kind::nan_logit,
                                      fault_kind::inf_logit,       fault_kind::empty_row,
                                      fault_kind::commit_ignored,  fault_kind::commit_throws,
                                      fault_kind::vocab_changes,   fault_kind::rollback_throws};

/// The operation a decode_error of `kind` must name.
std::string operation_of(fault_kind kind) {
  switch (kind) {
    case fault_kind::commit_ignored:
    case fault_kind::commit_throws:
      return "commit";
    case fault_kind::rollback_throws:
      return "rollback";
    case fault_kind::vocab_changes:
      return "vocab_size";
    case fault_kind::prefill_throws:
      return "prefill";
    default:
      return "evaluate";
  }
}

/// The models of the CFG tests: no zero probabilities (CFG mixes two -inf logits into NaN).
const toy_pair& cfg_toys() {
  static const toy_pair t{toy_ar_model(4, 7, 11, 0.0),
                          toy_ar_model::perturbed(toy_ar_model(4, 7, 11, 0.0), 0.5, 12, 0.0)};
  return t;
}

/// CFG's unconditional prompt in these tests: a longer one (class token 1 in front).
std::vector<token_t> cfg_uncond(std::span<const token_t> p) {
  std::vector<token_t> u(p.begin(), p.end());
  u.insert(u.begin(), 1);
  return u;
}

std::int64_t calls_of(const fsession& s, fault_kind kind) {
  if (kind == fault_kind::commit_ignored || kind == fault_kind::commit_throws) return s.commits();
  if (kind == fault_kind::rollback_throws) return s.rollbacks();
  return s.evaluates();
}

}  // namespace

TEST_CASE("decode faults: every fault at every call leaves the caches at the committed tokens",
          "[decode][faults]") {
  const auto& t = toys();
  const std::vector<token_t> prompt{0, 2};
  const index_t n = 8;
  const request_rng rng{5, 1, 0};
  const index_t V = t.target.vocab_size();
  for (const loop_id id : all_loops) {
    fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
    const auto reference = run_one(id, target, draft, prompt, n, rng);
    REQUIRE(static_cast<index_t>(reference.size()) == n);
    for (const bool on_draft : {false, true}) {
      if (on_draft && !has_draft(id)) continue;
      for (const fault_kind kind : solo_faults) {
        // The calls of this kind in an uninterrupted run (one more: no fault must happen).
        target.reset_counts();
        draft.reset_counts();
        (void)run_one(id, target, draft, prompt, n, rng);
        const std::int64_t calls = calls_of(on_draft ? draft : target, kind);
        for (std::int64_t at = kind == fault_kind::vocab_changes ? 2 : 1; at <= calls + 1; ++at) {
          INFO(name_of(id) << (on_draft ? " draft " : " target ") << "fault "
                           << static_cast<int>(kind) << " at call " << at << " of " << calls);
          fault_plan plan{kind, at, 5, 3, false};
          target.reset_counts();
          draft.reset_counts();
          (on_draft ? draft : target).plan() = plan;
          std::vector<token_t> committed;
          bool threw = false;
          try {
            const auto out = run_one(id, target, draft, prompt, n, rng);
            CHECK(out == reference);
            committed = out;
          } catch (const decode_error& e) {
            threw = true;
            INFO(e.what());
            CHECK(e.request() == 0);
            CHECK(e.source() == (on_draft ? fault_source::draft : fault_source::target));
            CHECK(e.operation() == operation_of(kind));
            CHECK(std::string(e.what()).find(on_draft ? "draft model" : "target model") !=
                  std::string::npos);
            if (std::find(std::begin(row_faults), std::end(row_faults), kind) !=
                std::end(row_faults)) {
              CHECK(e.row() >= 0);
              if (kind != fault_kind::empty_row) CHECK(e.column() == plan.column % V);
            }
            CHECK(e.caches_consistent());
            REQUIRE(e.committed().size() == 1);
            committed = e.committed()[0];
          }
          // An ignored commit of an empty path changes nothing, and is not detected.
          if (kind != fault_kind::commit_ignored) CHECK(threw == (at <= calls));
          (on_draft ? draft : target).plan() = {};
          INFO("committed " << ::Catch::Detail::stringify(committed) << ", reference "
                            << ::Catch::Detail::stringify(reference));
          REQUIRE(is_prefix(committed, reference));
          const auto seq = concat(prompt, committed);
          check_cache(t.target, target.inner(), seq);
          if (has_draft(id)) check_cache(t.draft, draft.inner(), seq, true);
          // Resuming from the committed tokens: the same greedy output.
          if (is_greedy(id) && static_cast<index_t>(committed.size()) < n) {
            const auto rest =
                run_one(id, target, draft, seq, n - static_cast<index_t>(committed.size()), rng);
            CHECK(concat(committed, rest) == reference);
          }
        }
      }
    }
  }
}

TEST_CASE("decode faults: a rollback that keeps failing leaves the caches flagged inconsistent",
          "[decode][faults]") {
  const auto& t = toys();
  const std::vector<token_t> prompt{0, 2};
  fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
  draft.plan() = {fault_kind::rollback_throws, 1, 0, 0, true};
  try {
    (void)speculative_decode(target, draft, prompt, sd_options(loop_id::sd_chain, 8),
                             request_rng{1, 0, 0});
    FAIL("no decode_error");
  } catch (const decode_error& e) {
    CHECK(e.source() == fault_source::draft);
    CHECK(e.operation() == "rollback");
    CHECK_FALSE(e.caches_consistent());
    CHECK(std::string(e.what()).find("NOT at the committed tokens") != std::string::npos);
    // The target was brought back all the same.
    check_cache(t.target, target.inner(), concat(prompt, e.committed()[0]));
  }
}

TEST_CASE("decode faults: a failing prefill is reported, its caches flagged inconsistent",
          "[decode][faults]") {
  const auto& t = toys();
  fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
  draft.plan() = {fault_kind::prefill_throws, 1, 0, 0, false};
  try {
    (void)speculative_decode(target, draft, std::vector<token_t>{0, 1},
                             sd_options(loop_id::sd_chain, 4), request_rng{});
    FAIL("no decode_error");
  } catch (const decode_error& e) {
    CHECK(e.source() == fault_source::draft);
    CHECK(e.operation() == "prefill");
    CHECK(e.step() == 0);
    CHECK_FALSE(e.caches_consistent());
    CHECK(e.committed()[0].empty());
    CHECK_THROWS_AS(std::rethrow_exception(e.cause()), testing::injected_fault);
  }
}

TEST_CASE("decode faults: a NaN logit is named with model, request, step, row and column",
          "[decode][faults]") {
  const auto& t = toys();
  fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
  // Third target pass, node 1, token 3.
  target.plan() = {fault_kind::nan_logit, 3, 1, 3, false};
  try {
    (void)speculative_decode(target, draft, std::vector<token_t>{0, 1},
                             sd_options(loop_id::sd_chain, 12), request_rng{3, 0, 0});
    FAIL("no decode_error");
  } catch (const decode_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("at step 2: target model evaluate: row 1, column 3, "
                                         "NaN logit"));
    CHECK(e.code() == status::nan_value);
    CHECK(e.step() == 2);
  }
}

TEST_CASE(
    "decode faults: a single request cancelled before its first pass, between steps, or by a "
    "callback that throws",
    "[decode][faults]") {
  const auto& t = toys();
  const std::vector<token_t> prompt{0, 2};
  const index_t n = 8;
  const request_rng rng{5, 1, 0};
  for (const loop_id id : all_loops) {
    INFO(name_of(id));
    fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
    const auto reference = run_one(id, target, draft, prompt, n, rng);
    request_status status = request_status::not_run;
    request_control control;
    control.status = &status;
    // A callback that never cancels: the uninterrupted run.
    control.cancel = [] { return false; };
    CHECK(run_one(id, target, draft, prompt, n, rng, {}, control) == reference);
    CHECK(status == request_status::completed);
    // Cancelled before the first pass (no commit yet), and after the first committed step.
    for (const std::int64_t after : {0, 1}) {
      INFO("cancelled after " << after << " commits");
      target.reset_counts();
      control.cancel = [&] { return target.commits() >= after; };
      const auto out = run_one(id, target, draft, prompt, n, rng, {}, control);
      CHECK(status == request_status::cancelled);
      REQUIRE(is_prefix(out, reference));
      CHECK(out.empty() == (after == 0));
      CHECK(out.size() < reference.size());
      const auto seq = concat(prompt, out);
      check_cache(t.target, target.inner(), seq);
      if (has_draft(id)) check_cache(t.draft, draft.inner(), seq, true);
      if (is_greedy(id)) {  // resuming gives the uninterrupted output
        const auto rest =
            run_one(id, target, draft, seq, n - static_cast<index_t>(out.size()), rng);
        CHECK(concat(out, rest) == reference);
      }
    }
    // A callback that throws after the first step: a fault of the loop, operation "cancel".
    target.reset_counts();
    control.cancel = [&]() -> bool {
      if (target.commits() >= 1) throw std::runtime_error("cancel lookup failed");
      return false;
    };
    try {
      (void)run_one(id, target, draft, prompt, n, rng, {}, control);
      FAIL("no decode_error");
    } catch (const decode_error& e) {
      CHECK(status == request_status::failed);
      CHECK(e.source() == fault_source::loop);
      CHECK(e.operation() == "cancel");
      CHECK_THAT(e.what(), Catch::Contains("cancel: cancel lookup failed"));
      CHECK(e.caches_consistent());
      const auto& committed = e.committed().at(0);
      REQUIRE(is_prefix(committed, reference));
      CHECK_FALSE(committed.empty());
      const auto seq = concat(prompt, committed);
      check_cache(t.target, target.inner(), seq);
      if (has_draft(id)) check_cache(t.draft, draft.inner(), seq, true);
    }
  }
}

TEST_CASE("decode faults: prompt tokens outside the vocabulary are refused up front",
          "[decode][faults]") {
  const auto& t = toys();
  fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
  const std::vector<token_t> bad{0, 4};
  CHECK_THROWS_WITH(
      speculative_decode(target, draft, bad, sd_options(loop_id::sd_chain, 4), request_rng{}),
      Catch::Contains("prompt[column 1]: token id out of range"));
  CHECK_THROWS_WITH(sjd_decode(target, bad, sjd_opts(loop_id::sjd, 4), request_rng{}),
                    Catch::Contains("prompt[column 1]"));
  CHECK_THROWS_WITH(jacobi_decode(target, std::vector<token_t>{-1}, jacobi_opts(4)),
                    Catch::Contains("prompt[column 0]"));
  CHECK_THROWS_WITH(multiblock_decode(target, bad, mb_opts(loop_id::multiblock, 4)),
                    Catch::Contains("prompt[column 1]"));
  fbatch tb(std::vector<fsession>(3, fsession{toy_model_session(t.target)}));
  const std::vector<std::vector<token_t>> prompts{{0}, {0, 1}, {0, 9}};
  const std::vector<request_rng> rngs(3);
  CHECK_THROWS_WITH(sjd_decode_batch(tb, prompts, sjd_opts(loop_id::sjd, 4), rngs),
                    Catch::Contains("prompts[row 2][column 1]"));
  CHECK(tb.session(0).evaluates() == 0);  // nothing ran
}

namespace {

const std::vector<std::vector<token_t>>& batch_prompts() {
  static const std::vector<std::vector<token_t>> p{{0}, {0, 1}, {0, 3, 2}, {0, 2}};
  return p;
}
struct batch_models {
  fbatch target, draft;
  explicit batch_models(const toy_pair& t)
      : target(std::vector<fsession>(4, fsession{toy_model_session(t.target)})),
        draft(std::vector<fsession>(4, fsession{toy_model_session(t.draft)})) {}
  void clear() {
    for (index_t r = 0; r < 4; ++r) {
      target.session(r).plan() = {};
      draft.session(r).plan() = {};
      target.session(r).reset_counts();
      draft.session(r).reset_counts();
    }
  }
};

}  // namespace

TEST_CASE("decode faults: batched, every request's caches end at its committed tokens",
          "[decode][faults][batch]") {
  const auto& t = toys();
  const index_t n = 8;
  const auto rngs = rngs_for(4, 21);
  for (const loop_id id : all_loops) {
    batch_models m(t);
    const auto reference = run_many(id, m.target, m.draft, batch_prompts(), n, rngs);
    for (const fault_kind kind : {fault_kind::evaluate_throws, fault_kind::nan_logit,
                                  fault_kind::commit_ignored, fault_kind::commit_throws}) {
      for (std::int64_t at = 1; at <= 6; ++at) {
        for (const bool isolate : {false, true}) {
          INFO(name_of(id) << " fault " << static_cast<int>(kind) << " at call " << at
                           << (isolate ? " isolated" : ""));
          m.clear();
          // Request 2 breaks for good (sticky): isolation must drop it.
          m.target.session(2).plan() = {kind, at, 0, 1, true};
          std::vector<request_outcome> outcomes(4);
          batch_control control;
          control.isolate = isolate;
          control.outcomes = outcomes;
          std::vector<std::vector<token_t>> committed;
          try {
            committed = run_many(id, m.target, m.draft, batch_prompts(), n, rngs, control);
            if (!isolate || outcomes[2].status == request_status::completed) {
              CHECK(committed == reference);  // request 2 finished before its faulty call
              continue;
            }
            for (std::size_t r = 0; r < 4; ++r)
              if (r != 2) {
                CHECK(committed[r] == reference[r]);  // bit-identical to the run without it
                CHECK(outcomes[r].status == request_status::completed);
              }
            REQUIRE(outcomes[2].status == request_status::failed);
            try {
              std::rethrow_exception(outcomes[2].error);
            } catch (const decode_error& e) {
              CHECK(e.request() == 2);
              CHECK(e.committed().at(0) == committed[2]);
            }
          } catch (const decode_error& e) {
            REQUIRE_FALSE(isolate);
            INFO(e.what());
            // A throwing batched call names request 2 only when it was alone in the call.
            CHECK((e.request() == 2 || (kind == fault_kind::evaluate_throws && e.request() == -1)));
            CHECK(e.caches_consistent());
            committed = e.committed();
            CHECK(outcomes[2].status == request_status::failed);
          }
          REQUIRE(committed.size() == 4);
          for (std::size_t r = 0; r < 4; ++r) {
            REQUIRE(is_prefix(committed[r], reference[r]));
            const auto seq = concat(batch_prompts()[r], committed[r]);
            const auto ri = static_cast<index_t>(r);
            check_cache(t.target, m.target.session(ri).inner(), seq);
            if (has_draft(id)) check_cache(t.draft, m.draft.session(ri).inner(), seq, true);
          }
        }
      }
    }
  }
}

TEST_CASE("decode faults: isolation retries a failed batched call request by request",
          "[decode][faults][batch]") {
  const auto& t = toys();
  const auto rngs = rngs_for(4, 3);
  for (const loop_id id : {loop_id::sd_chain, loop_id::sjd_pac, loop_id::jacobi}) {
    batch_models m(t);
    const auto reference = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs);
    m.clear();
    // A transient fault of request 1 inside a batched call of all four: the retry succeeds,
    // nothing is lost. (A call of one request is not retried: that request fails.)
    m.target.session(1).plan() = {fault_kind::evaluate_throws, 1, 0, 0, false};
    batch_control control;
    control.isolate = true;
    CHECK(run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, control) == reference);
  }
}

TEST_CASE(
    "decode faults: cancellation (before the first pass, between passes, between steps, a "
    "callback that throws), per-request limits and stop tokens",
    "[decode][faults][batch]") {
  const auto& t = toys();
  const auto rngs = rngs_for(4, 8);
  for (const loop_id id : all_loops) {
    INFO(name_of(id));
    batch_models m(t);
    const auto reference = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs);
    // Cancel request 3 before its first pass, request 1 once its target made 2 passes, request
    // 0 once it committed a step; request 2 goes on as without them.
    m.clear();
    std::vector<request_outcome> outcomes(4);
    batch_control control;
    control.outcomes = outcomes;
    control.cancel = [&](index_t r) {
      return r == 3 || (r == 1 && m.target.session(1).evaluates() >= 2) ||
             (r == 0 && m.target.session(0).commits() >= 1);
    };
    const auto out = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, control);
    CHECK(out[3].empty());
    CHECK_FALSE(out[0].empty());
    for (std::size_t r = 0; r < 4; ++r) {
      if (r == 2) {
        CHECK(outcomes[r].status == request_status::completed);
        CHECK(out[r] == reference[r]);
        continue;
      }
      CHECK(outcomes[r].status == request_status::cancelled);
      CHECK(is_prefix(out[r], reference[r]));
      CHECK(out[r].size() < reference[r].size());
      const auto ri = static_cast<index_t>(r);
      const auto seq = concat(batch_prompts()[r], out[r]);
      check_cache(t.target, m.target.session(ri).inner(), seq);
      if (has_draft(id)) check_cache(t.draft, m.draft.session(ri).inner(), seq, true);
    }
    // A callback that throws for request 2: a fault of request 2 (source loop, operation
    // "cancel"); without isolation the call ends, with it request 2 alone is dropped.
    for (const bool isolate : {false, true}) {
      m.clear();
      std::vector<request_outcome> o(4);
      batch_control c;
      c.isolate = isolate;
      c.outcomes = o;
      c.cancel = [&](index_t r) {
        if (r == 2 && m.target.session(2).evaluates() >= 1)
          throw std::runtime_error("cancel lookup failed");
        return false;
      };
      std::vector<std::vector<token_t>> got;
      try {
        got = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, c);
        REQUIRE(isolate);
        REQUIRE(o[2].status == request_status::failed);
        for (const std::size_t r : {0u, 1u, 3u}) CHECK(got[r] == reference[r]);
        try {
          std::rethrow_exception(o[2].error);
        } catch (const decode_error& e) {
          CHECK(e.request() == 2);
          CHECK(e.source() == fault_source::loop);
          CHECK(e.operation() == "cancel");
        }
      } catch (const decode_error& e) {
        REQUIRE_FALSE(isolate);
        CHECK(e.request() == 2);
        CHECK(e.source() == fault_source::loop);
        CHECK(e.operation() == "cancel");
        CHECK_THAT(e.what(), Catch::Contains("in request 2 at step") &&
                                 Catch::Contains("cancel: cancel lookup failed"));
        CHECK(e.caches_consistent());
        got = e.committed();
      }
      for (index_t r = 0; r < 4; ++r) {
        const auto seq =
            concat(batch_prompts()[static_cast<std::size_t>(r)], got[static_cast<std::size_t>(r)]);
        REQUIRE(
            is_prefix(got[static_cast<std::size_t>(r)], reference[static_cast<std::size_t>(r)]));
        check_cache(t.target, m.target.session(r).inner(), seq);
        if (has_draft(id)) check_cache(t.draft, m.draft.session(r).inner(), seq, true);
      }
    }
    // Per-request limits: each request as if decoded with its own max_new_tokens / stop token.
    m.clear();
    std::vector<request_limits> limits(4);
    limits[0].max_new_tokens = 3;
    limits[2].stop_token = reference[2].at(2);
    limits[3].max_new_tokens = 5;
    limits[3].stop_token = no_token;
    batch_control limited;
    limited.limits = limits;
    const auto lim = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, limited);
    for (std::size_t r = 0; r < 4; ++r) {
      const index_t max_r = limits[r].max_new_tokens >= 0 ? limits[r].max_new_tokens : 8;
      fsession solo_t{toy_model_session(t.target)}, solo_d{toy_model_session(t.draft)};
      std::vector<token_t> want;
      if (limits[r].stop_token >= 0) {
        // A stop token: the run is the reference up to its first occurrence.
        const auto at = std::find(reference[r].begin(), reference[r].end(), limits[r].stop_token);
        want.assign(reference[r].begin(), at + 1);
      } else {
        want = run_one(id, solo_t, solo_d, batch_prompts()[r], max_r, rngs[r]);
      }
      CHECK(lim[r] == want);
    }
  }
}

TEST_CASE("decode faults: bad batch controls are refused", "[decode][faults][batch]") {
  const auto& t = toys();
  batch_models m(t);
  const auto rngs = rngs_for(4, 1);
  std::vector<request_outcome> three(3);
  batch_control c;
  c.outcomes = three;
  CHECK_THROWS_WITH(run_many(loop_id::sjd, m.target, m.draft, batch_prompts(), 4, rngs, c),
                    Catch::Contains("outcomes"));
  std::vector<request_limits> limits(4);
  limits[1].max_new_tokens = 0;
  batch_control l;
  l.limits = limits;
  CHECK_THROWS_WITH(run_many(loop_id::jacobi, m.target, m.draft, batch_prompts(), 4, rngs, l),
                    Catch::Contains("max_new_tokens"));
  // SSD has neither a token limit nor stop tokens: limits that set one are refused.
  const toy_masked_model masked(6, 4);
  ssd_options so;
  so.gen_length = 4;
  so.block_size = 2;
  const std::vector<std::vector<token_t>> prompts{{1, 2}, {3}};
  for (const bool list : {false, true}) {
    std::vector<request_limits> two(2);
    if (list)
      two[1].stop_tokens = std::vector<token_t>{1};
    else
      two[0].max_new_tokens = 3;
    batch_control s;
    s.limits = two;
    CHECK_THROWS_WITH(ssd_decode_batch(masked, prompts, so, {}, s),
                      Catch::Contains(list ? "limits[row 1]" : "limits[row 0]"));
  }
}

TEST_CASE(
    "decode faults: under classifier-free guidance both streams stay at the committed "
    "tokens",
    "[decode][faults][cfg]") {
  const toy_pair& t = cfg_toys();
  const std::vector<token_t> prompt{0, 2};
  const auto uncond = cfg_uncond;
  for (const loop_id id : all_loops) {
    fbatch inner(std::vector<fsession>(2, fsession{toy_model_session(t.target)}));
    cfg_model<fbatch> guided(inner, 1.5f, uncond);
    fsession draft{toy_model_session(t.draft)};
    const auto reference = run_one(id, guided, draft, prompt, 8, request_rng{4, 0, 0});
    for (const fault_kind kind :
         {fault_kind::evaluate_throws, fault_kind::nan_logit, fault_kind::commit_ignored}) {
      for (const index_t stream : {0, 1}) {
        for (std::int64_t at = 1; at <= 5; ++at) {
          INFO(name_of(id) << " stream " << stream << " fault " << static_cast<int>(kind) << " at "
                           << at);
          for (index_t s = 0; s < 2; ++s) {
            inner.session(s).plan() = {};
            inner.session(s).reset_counts();
          }
          inner.session(stream).plan() = {kind, at, 0, 1, false};
          std::vector<token_t> committed;
          try {
            committed = run_one(id, guided, draft, prompt, 8, request_rng{4, 0, 0});
            CHECK(committed == reference);
          } catch (const decode_error& e) {
            INFO(e.what());
            CHECK(e.source() == fault_source::target);
            CHECK(e.caches_consistent());
            committed = e.committed()[0];
          }
          REQUIRE(is_prefix(committed, reference));
          inner.session(stream).plan() = {};
          check_cache(t.target, inner.session(0).inner(), concat(prompt, committed));
          check_cache(t.target, inner.session(1).inner(), concat(uncond(prompt), committed));
        }
      }
    }
  }
}

namespace {

/// The models of the resumption G-tests (V = 3, 4 positions: 81 sequences).
const toy_pair& resume_toys() {
  static const toy_pair t{toy_ar_model(3, 4, 31),
                          toy_ar_model::perturbed(toy_ar_model(3, 4, 31), 0.6, 32)};
  return t;
}

/// G-test of `counts(false)` (resumed runs) against the target's sequence law, and of the
/// control `counts(true)` (resumed from a corrupted token), which must fail.
void check_resumed_law(const std::function<std::vector<std::uint64_t>(bool corrupt)>& counts) {
  const auto law = resume_toys().target.sequence_law();
  const auto g = specula::testing::g_test(counts(false), law);
  INFO(g);
  CHECK(g.impossible_observations == 0);
  CHECK(g.p_value > 1e-4);
  const auto bad = specula::testing::g_test(counts(true), law);
  INFO("control " << bad);
  CHECK((bad.impossible_observations > 0 || bad.p_value < 1e-6));
}

/// Counts of the sequences `run(target, draft, bos, r)` returns for r in [0, runs), over one
/// pair of faulty sessions of `t`'s models and the BOS prompt.
template <class Run>
std::vector<std::uint64_t> toy_sequence_counts(const toy_pair& t, std::uint32_t runs, Run&& run) {
  const toy_ar_model& law = t.target;
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(law.num_sequences()), 0);
  fsession target{toy_model_session(law)}, draft{toy_model_session(t.draft)};
  const std::vector<token_t> bos{0};
  for (std::uint32_t r = 0; r < runs; ++r)
    ++counts[static_cast<std::size_t>(law.sequence_index(run(target, draft, bos, r)))];
  return counts;
}

/// Sequences of `law.horizon()` tokens from `runs` runs of loop `id` on a fresh request (BOS
/// prompt), each interrupted by a target fault at a random pass and resumed from its committed
/// tokens with a new stream; `corrupt`: the control, which resumes after changing the last
/// committed token.
std::vector<std::uint64_t> resumed_counts(loop_id id, const toy_pair& t, std::uint32_t runs,
                                          bool corrupt) {
  const index_t n = t.target.horizon();
  return toy_sequence_counts(
      t, runs,
      [&](fsession& target, fsession& draft, const std::vector<token_t>& bos, std::uint32_t r) {
        const auto at = static_cast<std::int64_t>(
            1 + uniform_at(request_rng{99, r, 0}, draw_id{0, 0}) * static_cast<double>(n));
        target.reset_counts();
        target.plan() = {fault_kind::evaluate_throws, at, 0, 0, false};
        std::vector<token_t> out;
        try {
          out = run_one(id, target, draft, bos, n, request_rng{7, r, 0});
        } catch (const decode_error& e) {
          out = e.committed()[0];
          target.plan() = {};
          if (corrupt && !out.empty()) out.back() = (out.back() + 1) % t.target.vocab_size();
          if (static_cast<index_t>(out.size()) < n) {
            const auto rest = run_one(id, target, draft, concat(bos, out),
                                      n - static_cast<index_t>(out.size()), request_rng{8, r, 0});
            out.insert(out.end(), rest.begin(), rest.end());
          }
        }
        return out;
      });
}

}  // namespace

TEST_CASE("decode faults: resuming after a fault keeps the target's law (G-test)",
          "[decode][faults][stats]") {
  for (const loop_id id : {loop_id::sd_chain, loop_id::sd_tree, loop_id::sjd, loop_id::sjd_pac,
                           loop_id::multiblock_stochastic}) {
    INFO(name_of(id));
    check_resumed_law(
        [&](bool corrupt) { return resumed_counts(id, resume_toys(), 4000, corrupt); });
  }
}

namespace {

/// Sequences of `law.horizon()` tokens from `runs` requests each decoded in two calls of loop
/// `id` (sampled autoregressive decoding for loop_id::autoregressive): the first call stops
/// after a random number k of new tokens, the second continues from the prompt and those tokens
/// with the same seed and request id and the stream's step advanced by k; `same_step`: the
/// control, whose second call starts at step 0 again and so repeats the first call's draws.
std::vector<std::uint64_t> continued_counts(loop_id id, const toy_pair& t, std::uint32_t runs,
                                            bool same_step) {
  const index_t n = t.target.horizon();
  return toy_sequence_counts(
      t, runs,
      [&](fsession& target, fsession& draft, const std::vector<token_t>& bos, std::uint32_t r) {
        const auto call = [&](std::span<const token_t> prompt, index_t budget, request_rng rng) {
          if (id != loop_id::autoregressive) return run_one(id, target, draft, prompt, budget, rng);
          autoregressive_options o;
          o.max_new_tokens = budget;
          return autoregressive_decode(target, prompt, o, rng);
        };
        const auto k = static_cast<index_t>(1 + uniform_at(request_rng{98, r, 0}, draw_id{0, 0}) *
                                                    static_cast<double>(n - 1));
        std::vector<token_t> out = call(bos, k, request_rng{7, r, 0});
        const auto step = same_step ? 0u : static_cast<std::uint32_t>(out.size());
        const auto rest =
            call(concat(bos, out), n - static_cast<index_t>(out.size()), request_rng{7, r, step});
        out.insert(out.end(), rest.begin(), rest.end());
        return out;
      });
}

}  // namespace

TEST_CASE("decode: a request continued with its stream's step advanced keeps the target's law",
          "[decode][faults][stats]") {
  // The control: the same step repeats the first call's draws (the loops count their steps on
  // from the stream's), which the G-test must see.
  for (const loop_id id :
       {loop_id::autoregressive, loop_id::sd_chain, loop_id::sd_tree, loop_id::sjd,
        loop_id::sjd_pac, loop_id::multiblock_stochastic, loop_id::lookup}) {
    INFO(name_of(id));
    check_resumed_law(
        [&](bool same_step) { return continued_counts(id, resume_toys(), 40000, same_step); });
  }
}

namespace {

/// The first `stops` token in `out` ends it (kept); the rest is cut.
std::vector<token_t> cut_at_stop(const std::vector<token_t>& out, std::span<const token_t> stops) {
  const auto at = std::find_first_of(out.begin(), out.end(), stops.begin(), stops.end());
  return {out.begin(), at == out.end() ? at : at + 1};
}

/// A guided batch of `b` requests: 2 b inner sessions (request r conditional, r + b its
/// unconditional twin) under cfg_model, and a plain draft batch.
struct cfg_batch {
  fbatch inner, draft;
  cfg_model<fbatch> guided;
  cfg_batch(const toy_pair& t, index_t b)
      : inner(std::vector<fsession>(static_cast<std::size_t>(2 * b),
                                    fsession{toy_model_session(t.target)})),
        draft(std::vector<fsession>(static_cast<std::size_t>(b),
                                    fsession{toy_model_session(t.draft)})),
        guided(inner, 1.5f, cfg_uncond) {}
  cfg_batch(const cfg_batch&) = delete;
  cfg_batch& operator=(const cfg_batch&) = delete;
};

}  // namespace

TEST_CASE(
    "decode faults: batched under classifier-free guidance, every stream at its request's "
    "committed tokens, the others bit-identical",
    "[decode][faults][batch][cfg]") {
  const toy_pair& t = cfg_toys();
  const index_t n = 8, B = 4;
  const auto& prompts = batch_prompts();
  const auto rngs = rngs_for(4, 31);
  // The batch without request 1: the reference of the other requests.
  const std::vector<std::vector<token_t>> others{prompts[0], prompts[2], prompts[3]};
  const std::vector<request_rng> others_rngs{rngs[0], rngs[2], rngs[3]};
  for (const loop_id id : all_loops) {
    cfg_batch clean(t, B);
    const auto reference = run_many(id, clean.guided, clean.draft, prompts, n, rngs);
    cfg_batch without(t, 3);
    const auto without_1 = run_many(id, without.guided, without.draft, others, n, others_rngs);
    const std::vector<std::vector<token_t>> others_reference{reference[0], reference[2],
                                                             reference[3]};
    REQUIRE(without_1 == others_reference);
    for (const fault_kind kind : {fault_kind::evaluate_throws, fault_kind::nan_logit,
                                  fault_kind::commit_ignored, fault_kind::commit_throws}) {
      for (const bool uncond_stream : {false, true}) {
        for (std::int64_t at = 1; at <= 5; ++at) {
          for (const bool isolate : {false, true}) {
            INFO(name_of(id) << (uncond_stream ? " unconditional" : " conditional") << " fault "
                             << static_cast<int>(kind) << " at " << at
                             << (isolate ? " isolated" : ""));
            cfg_batch m(t, B);
            // Request 1's stream breaks for good.
            m.inner.session(uncond_stream ? 1 + B : 1).plan() = {kind, at, 0, 1, true};
            std::vector<request_outcome> outcomes(4);
            batch_control control;
            control.isolate = isolate;
            control.outcomes = outcomes;
            std::vector<std::vector<token_t>> out;
            try {
              out = run_many(id, m.guided, m.draft, prompts, n, rngs, control);
              if (!isolate) CHECK(out == reference);  // request 1 finished before its fault
              for (const index_t r : {0, 2, 3}) {
                CHECK(outcomes[static_cast<std::size_t>(r)].status == request_status::completed);
                CHECK(out[static_cast<std::size_t>(r)] ==
                      without_1[static_cast<std::size_t>(r == 0 ? 0 : r - 1)]);
              }
              if (outcomes[1].status == request_status::completed) {
                CHECK(out[1] == reference[1]);  // finished before its faulty call
              } else {
                REQUIRE(outcomes[1].status == request_status::failed);
                try {
                  std::rethrow_exception(outcomes[1].error);
                } catch (const decode_error& e) {
                  CHECK(e.request() == 1);
                  CHECK(e.source() == fault_source::target);
                  CHECK(e.caches_consistent());
                  CHECK(e.committed().at(0) == out[1]);
                }
              }
            } catch (const decode_error& e) {
              REQUIRE_FALSE(isolate);
              INFO(e.what());
              CHECK(
                  (e.request() == 1 || (kind == fault_kind::evaluate_throws && e.request() == -1)));
              CHECK(e.source() == fault_source::target);
              CHECK(e.caches_consistent());
              out = e.committed();
            }
            REQUIRE(out.size() == 4);
            m.inner.session(uncond_stream ? 1 + B : 1).plan() = {};
            // Every stream of every request at the request's committed tokens (checked against
            // a fresh model prefilled with them).
            for (index_t r = 0; r < B; ++r) {
              const auto& o = out[static_cast<std::size_t>(r)];
              const auto& p = prompts[static_cast<std::size_t>(r)];
              REQUIRE(is_prefix(o, reference[static_cast<std::size_t>(r)]));
              check_cache(t.target, m.inner.session(r).inner(), concat(p, o));
              check_cache(t.target, m.inner.session(r + B).inner(), concat(cfg_uncond(p), o));
              if (has_draft(id))
                check_cache(t.draft, m.draft.session(r).inner(), concat(p, o), true);
            }
          }
        }
      }
    }
  }
}

namespace {

/// Sequences of `law.horizon()` tokens from `calls` batched calls of loop `id` over `B` fresh
/// requests (BOS prompts): request r's target returns a NaN at a random pass (at most one per
/// request); even calls isolate (the faulty requests are dropped), odd ones do not (the first
/// fault ends the call, every request keeps its committed tokens). Every unfinished request is
/// then resumed from its committed tokens in one batched call with new streams and its own
/// token limit; `corrupt`: the control, which resumes after changing the last committed token.
std::vector<std::uint64_t> batched_resumed_counts(loop_id id, const toy_pair& t,
                                                  std::uint32_t calls, bool corrupt) {
  const toy_ar_model& law = t.target;
  const index_t n = law.horizon(), V = law.vocab_size();
  constexpr index_t B = 8;
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(law.num_sequences()), 0);
  constexpr auto b = static_cast<std::size_t>(B);
  fbatch target(std::vector<fsession>(b, fsession{toy_model_session(law)}));
  fbatch draft(std::vector<fsession>(b, fsession{toy_model_session(t.draft)}));
  const std::vector<token_t> bos{0};
  const std::vector<std::vector<token_t>> prompts(b, bos);
  for (std::uint32_t c = 0; c < calls; ++c) {
    std::vector<request_rng> rngs;
    for (index_t r = 0; r < B; ++r) {
      const auto id_r = static_cast<std::uint32_t>(c * B + r);
      rngs.push_back({7, id_r, 0});
      const auto at = static_cast<std::int64_t>(
          1 + uniform_at(request_rng{99, id_r, 0}, draw_id{0, 0}) * static_cast<double>(n));
      target.session(r).reset_counts();
      target.session(r).plan() = {fault_kind::nan_logit, at, 0, 0, false};
    }
    batch_control control;
    control.isolate = c % 2 == 0;
    std::vector<std::vector<token_t>> out;
    try {
      out = run_many(id, target, draft, prompts, n, rngs, control);
    } catch (const decode_error& e) {
      REQUIRE_FALSE(control.isolate);
      out = e.committed();
    }
    REQUIRE(out.size() == b);
    std::vector<std::vector<token_t>> resume;
    std::vector<request_rng> resume_rngs;
    std::vector<request_limits> limits;
    std::vector<std::size_t> which;
    for (std::size_t r = 0; r < out.size(); ++r) {
      target.session(static_cast<index_t>(r)).plan() = {};
      auto& o = out[r];
      if (static_cast<index_t>(o.size()) == n) continue;
      if (corrupt && !o.empty()) o.back() = static_cast<token_t>((o.back() + 1) % V);
      resume.push_back(concat(bos, o));
      resume_rngs.push_back({8, static_cast<std::uint32_t>(c * B + static_cast<index_t>(r)), 0});
      limits.emplace_back().max_new_tokens = n - static_cast<index_t>(o.size());
      which.push_back(r);
    }
    if (!resume.empty()) {
      batch_control resumed;
      resumed.limits = limits;
      const auto rest = run_many(id, target, draft, resume, n, resume_rngs, resumed);
      for (std::size_t i = 0; i < which.size(); ++i)
        out[which[i]].insert(out[which[i]].end(), rest[i].begin(), rest[i].end());
    }
    for (const auto& o : out) ++counts[static_cast<std::size_t>(law.sequence_index(o))];
  }
  return counts;
}

}  // namespace

TEST_CASE("decode faults: resuming faulted requests of a batch keeps the target's law (G-test)",
          "[decode][faults][batch][stats]") {
  for (const loop_id id :
       {loop_id::sd_chain, loop_id::sd_tree, loop_id::sjd_pac, loop_id::multiblock_stochastic}) {
    INFO(name_of(id));
    check_resumed_law(
        [&](bool corrupt) { return batched_resumed_counts(id, resume_toys(), 500, corrupt); });
  }
}

TEST_CASE("decode faults: stop-token lists in the options and per request",
          "[decode][faults][batch]") {
  const auto& t = toys();
  const auto rngs = rngs_for(4, 8);
  const std::vector<token_t> prompt{0, 2};
  for (const loop_id id : all_loops) {
    INFO(name_of(id));
    // One request: the output ends at the first token of the list, as with a single stop token.
    {
      fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
      const auto full = run_one(id, target, draft, prompt, 8, rngs[0]);
      const std::vector<token_t> stops{full.at(5), full.at(2)};
      CHECK(run_one(id, target, draft, prompt, 8, rngs[0], stops) == cut_at_stop(full, stops));
    }
    batch_models m(t);
    const auto reference = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs);
    // The options' list: every request stops at its first token of it.
    const std::vector<token_t> common{reference[3].at(4)};
    m.clear();
    const auto listed = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, {}, common);
    for (std::size_t r = 0; r < 4; ++r) CHECK(listed[r] == cut_at_stop(reference[r], common));
    // Per request: request 0 its own list (replacing the options'), request 1 none (an empty
    // list), request 2 a stop token and a list, request 3 the options' list with its own limit.
    std::vector<request_limits> limits(4);
    limits[0].stop_tokens = std::vector<token_t>{reference[0].at(6), reference[0].at(3)};
    limits[1].stop_tokens = std::vector<token_t>{};
    limits[2].stop_token = reference[2].at(5);
    limits[2].stop_tokens = std::vector<token_t>{reference[2].at(3)};
    limits[3].max_new_tokens = 3;
    batch_control control;
    control.limits = limits;
    m.clear();
    const auto per = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, control, common);
    // A stop token inside a step's accepted path: the caches end at the output all the same.
    for (index_t r = 0; r < 4; ++r) {
      const auto seq =
          concat(batch_prompts()[static_cast<std::size_t>(r)], per[static_cast<std::size_t>(r)]);
      check_cache(t.target, m.target.session(r).inner(), seq);
      if (has_draft(id)) check_cache(t.draft, m.draft.session(r).inner(), seq, true);
    }
    CHECK(per[0] == cut_at_stop(reference[0], *limits[0].stop_tokens));
    CHECK(per[1] == reference[1]);
    const std::vector<token_t> two{reference[2].at(5), reference[2].at(3)};
    CHECK(per[2] == cut_at_stop(reference[2], two));
    // A token limit can change a loop's drafts near the end: the reference is request 3 alone.
    fsession solo_t{toy_model_session(t.target)}, solo_d{toy_model_session(t.draft)};
    CHECK(per[3] == run_one(id, solo_t, solo_d, batch_prompts()[3], 3, rngs[3], common));
  }
}

TEST_CASE("decode faults: bad stop tokens and limits are refused naming the request and index",
          "[decode][faults][batch][bad_input]") {
  const auto& t = toys();
  const std::vector<token_t> prompt{0, 2};
  const std::vector<token_t> bad_list{1, 4};  // V = 4
  for (const loop_id id : all_loops) {
    INFO(name_of(id));
    fsession target{toy_model_session(t.target)}, draft{toy_model_session(t.draft)};
    CHECK_THROWS_WITH(run_one(id, target, draft, prompt, 4, request_rng{}, bad_list),
                      Catch::Contains("stop_tokens[column 1]: token id out of range (value 4)"));
    CHECK(target.prefills() == 0);
    batch_models m(t);
    const auto rngs = rngs_for(4, 1);
    const auto refused = [&](std::vector<request_limits> limits, const char* message) {
      m.clear();
      batch_control c;
      c.limits = limits;
      CHECK_THROWS_WITH(run_many(id, m.target, m.draft, batch_prompts(), 4, rngs, c),
                        Catch::Contains(message));
      for (index_t r = 0; r < 4; ++r) {
        CHECK(m.target.session(r).prefills() == 0);  // refused before any model is touched
        CHECK(m.draft.session(r).prefills() == 0);
      }
    };
    std::vector<request_limits> l(4);
    l[2].stop_tokens = std::vector<token_t>{0, 2, -3};
    refused(l, "limits.stop_tokens[row 2][column 2]: token id out of range (value -3)");
    l = std::vector<request_limits>(4);
    l[1].max_new_tokens = 0;
    refused(l, "limits.max_new_tokens[row 1]");
    l = std::vector<request_limits>(4);
    l[3].stop_token = 4;
    refused(l, "limits.stop_token[row 3]: token id out of range (value 4)");
    l[3].stop_token = -7;
    refused(l, "limits.stop_token[row 3]");
    m.clear();
    CHECK_THROWS_WITH(run_many(id, m.target, m.draft, batch_prompts(), 4, rngs, {}, bad_list),
                      Catch::Contains("stop_tokens[column 1]"));
  }
}

namespace {

/// Faults of a masked model at each of its first passes, in `decode` (one request) and
/// `decode_batch` (three, with isolation): the decoded positions reported are the clean run's
/// (the others still masked), and with isolation only the faulty request is dropped, the
/// others equal the clean batch. A single request cancelled after its first pass returns its
/// sequence so far.
template <class Inner, class Decode, class DecodeBatch>
void check_masked_faults(const Inner& inner, const ssd_options& o, Decode decode,
                         DecodeBatch decode_batch) {
  using faulty = faulty_masked<Inner>;
  const std::vector<token_t> prompt{1, 2};
  const faulty clean{inner};
  const auto reference = decode(clean, prompt, o);
  const std::vector<std::vector<token_t>> prompts{prompt, {3}, {4, 1, 2}};
  const auto clean_out = decode_batch(clean, prompts, o, batch_control{});
  // Cancelled before the second pass: the sequence so far, the clean run's where decoded.
  {
    const faulty counted{inner};
    request_status status = request_status::not_run;
    request_control control;
    control.status = &status;
    control.cancel = [&] { return counted.evaluates() >= 1; };
    const auto part = decode(counted, prompt, o, control);
    CHECK(status == request_status::cancelled);
    REQUIRE(part.size() == reference.size());
    index_t decoded = 0;
    for (std::size_t i = 0; i < part.size(); ++i) {
      if (part[i] == counted.mask_token()) continue;
      ++decoded;
      CHECK(part[i] == reference[i]);
    }
    CHECK(decoded >= 1);
    CHECK(decoded < o.gen_length);
  }
  for (const fault_kind kind :
       {fault_kind::evaluate_throws, fault_kind::nan_logit, fault_kind::empty_row}) {
    for (std::int64_t at = 1; at <= 4; ++at) {
      INFO("fault " << static_cast<int>(kind) << " at " << at);
      const faulty m{inner, {kind, at, 3, 2, false}};
      try {
        (void)decode(m, prompt, o);
        FAIL("no decode_error");
      } catch (const decode_error& e) {
        INFO(e.what());
        CHECK(e.source() == fault_source::target);
        CHECK(e.operation() == "evaluate");
        CHECK(e.step() >= 0);
        CHECK(e.caches_consistent());
        const auto& part = e.committed()[0];
        REQUIRE(part.size() == reference.size());
        index_t decoded = 0;
        for (std::size_t i = 0; i < part.size(); ++i) {
          if (part[i] == m.mask_token()) continue;
          ++decoded;
          CHECK(part[i] == reference[i]);
        }
        CHECK(decoded < o.gen_length);
      }
      const faulty b{inner, {kind, at, 0, 2, false}};
      std::vector<request_outcome> outcomes(3);
      batch_control c;
      c.isolate = true;
      c.outcomes = outcomes;
      const auto out = decode_batch(b, prompts, o, c);
      index_t failed = 0;
      for (std::size_t r = 0; r < 3; ++r) {
        if (outcomes[r].status == request_status::failed) {
          ++failed;
          continue;
        }
        CHECK(outcomes[r].status == request_status::completed);
        CHECK(out[r] == clean_out[r]);
      }
      // A throwing call of several requests is retried request by request and succeeds.
      CHECK(failed == (kind == fault_kind::evaluate_throws ? 0 : 1));
    }
  }
}

}  // namespace

TEST_CASE(
    "decode faults: stepwise diffusion decoding (SSD's baseline) and SSD, uncached and "
    "through the dual cache",
    "[decode][faults]") {
  ssd_options o;
  o.gen_length = 8;
  o.block_size = 4;
  o.draft_length = 3;
  const auto stepwise = [](const auto& m, std::span<const token_t> p, const ssd_options& opt,
                           const request_control& c = {}) {
    return diffusion_stepwise_decode(m, p, opt, nullptr, c);
  };
  const auto stepwise_batch = [](const auto& m, const std::vector<std::vector<token_t>>& ps,
                                 const ssd_options& opt, const batch_control& c) {
    return diffusion_stepwise_decode_batch(m, ps, opt, {}, c);
  };
  const auto ssd = [](const auto& m, std::span<const token_t> p, const ssd_options& opt,
                      const request_control& c = {}) { return ssd_decode(m, p, opt, nullptr, c); };
  const auto ssd_batch = [](const auto& m, const std::vector<std::vector<token_t>>& ps,
                            const ssd_options& opt,
                            const batch_control& c) { return ssd_decode_batch(m, ps, opt, {}, c); };
  SECTION("stepwise, uncached") {
    check_masked_faults(toy_masked_model(6, 9), o, stepwise, stepwise_batch);
  }
  SECTION("SSD, uncached") { check_masked_faults(toy_masked_model(6, 9), o, ssd, ssd_batch); }
  o.cache = ssd_cache::dual;
  o.refresh_interval = 2;
  const decode_testing::toy_dual_cache_model dual(6, 9);
  SECTION("stepwise, dual cache") { check_masked_faults(dual, o, stepwise, stepwise_batch); }
  SECTION("SSD, dual cache") { check_masked_faults(dual, o, ssd, ssd_batch); }
}
