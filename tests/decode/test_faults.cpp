// Decoding loops under faults (docs/decoding.md, "Faults"): a model that throws, returns a
// non-finite or empty row, ignores or fails a commit, fails a rollback or changes its vocabulary
// at any of its passes. For every loop (SD chain / tree / greedy, Cool-SD, SJD, SJD-PAC,
// Jacobi, multi-block greedy and stochastic, SSD; alone, batched, under CFG):
// - the loop throws decode_error naming the request, the model, the operation (and the row
//   and column of a bad logit);
// - the committed tokens it reports are a prefix of the uninterrupted run's output, and every
//   model's cache equals them (checked against a fresh model prefilled with them: same
//   context, same row for the next root);
// - resuming from them gives the uninterrupted greedy output, or the target's law (G-tests,
//   with a control that resumes from a corrupted token and must fail);
// - batched with isolation, a faulty request is dropped and the others' outputs equal a run
//   without the fault; cancellation and per-request limits; bad controls are refused.
// Models are faulty_session / faulty_masked wrappers around the toy models.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <specula/decode/batch.hpp>
#include <specula/decode/cfg.hpp>
#include <specula/decode/jacobi.hpp>
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
};
constexpr loop_id all_loops[] = {
    loop_id::sd_chain, loop_id::sd_tree,    loop_id::sd_greedy,
    loop_id::cool_sd,  loop_id::sjd,        loop_id::sjd_pac,
    loop_id::jacobi,   loop_id::multiblock, loop_id::multiblock_stochastic};

const char* name_of(loop_id id) {
  constexpr const char* names[] = {"sd_chain", "sd_tree",    "sd_greedy",
                                   "cool_sd",  "sjd",        "sjd_pac",
                                   "jacobi",   "multiblock", "multiblock_stochastic"};
  return names[static_cast<int>(id)];
}
bool has_draft(loop_id id) { return static_cast<int>(id) <= static_cast<int>(loop_id::cool_sd); }
/// Output a function of the prompt alone (resuming gives the same tokens).
bool is_greedy(loop_id id) {
  return id == loop_id::sd_greedy || id == loop_id::jacobi || id == loop_id::multiblock;
}

speculative_options sd_options(loop_id id, index_t n) {
  speculative_options o;
  o.draft_length = 3;
  o.max_new_tokens = n;
  if (id == loop_id::sd_tree) o.draft_tree = trees::full(2, 2);
  if (id == loop_id::sd_greedy) o.mode = draft_mode::greedy;
  return o;
}
sjd_options sjd_opts(loop_id id, index_t n) {
  sjd_options o;
  o.window = 4;
  o.max_new_tokens = n;
  if (id == loop_id::sjd_pac) {
    o.adaptive_continuation = true;
    o.proactive_drafting = true;
    o.pd_width = 2;
  }
  return o;
}
jacobi_options jacobi_opts(index_t n) {
  jacobi_options o;
  o.window = 3;
  o.max_new_tokens = n;
  return o;
}
multiblock_options mb_opts(loop_id id, index_t n) {
  multiblock_options o;
  o.block_size = 3;
  o.max_blocks = 2;
  o.spawn_ratio = 0.5;
  o.max_new_tokens = n;
  o.stochastic = id == loop_id::multiblock_stochastic;
  o.recycling = !o.stochastic;
  return o;
}
using cool_verifier = tree_verifier<host::sequential_policy, scheduled_relaxed_rule>;

/// Runs loop `id` on one request (models: session_model; the draft unused by draft-free loops).
template <class T, class D>
std::vector<token_t> run_one(loop_id id, T& target, D& draft, std::span<const token_t> prompt,
                             index_t n, request_rng rng) {
  switch (id) {
    case loop_id::sd_chain:
    case loop_id::sd_tree:
      return speculative_decode(target, draft, prompt, sd_options(id, n), rng);
    case loop_id::sd_greedy:
      return speculative_decode(target, draft, prompt, sd_options(id, n), rng,
                                greedy_tree_verifier<>{});
    case loop_id::cool_sd:
      return speculative_decode(target, draft, prompt, sd_options(id, n), rng, cool_verifier{});
    case loop_id::sjd:
    case loop_id::sjd_pac:
      return sjd_decode(target, prompt, sjd_opts(id, n), rng);
    case loop_id::jacobi:
      return jacobi_decode(target, prompt, jacobi_opts(n), rng);
    case loop_id::multiblock:
    case loop_id::multiblock_stochastic:
      return multiblock_decode(target, prompt, mb_opts(id, n), rng);
  }
  return {};
}

/// Runs loop `id` batched (models: batched_session_model).
template <class T, class D>
std::vector<std::vector<token_t>> run_many(loop_id id, T& target, D& draft,
                                           std::span<const std::vector<token_t>> prompts, index_t n,
                                           std::span<const request_rng> rngs,
                                           const batch_control& control = {}) {
  switch (id) {
    case loop_id::sd_chain:
    case loop_id::sd_tree:
      return speculative_decode_batch(target, draft, prompts, sd_options(id, n), rngs,
                                      tree_verifier<>{}, {}, control);
    case loop_id::sd_greedy:
      return speculative_decode_batch(target, draft, prompts, sd_options(id, n), rngs,
                                      greedy_tree_verifier<>{}, {}, control);
    case loop_id::cool_sd:
      return speculative_decode_batch(target, draft, prompts, sd_options(id, n), rngs,
                                      cool_verifier{}, {}, control);
    case loop_id::sjd:
    case loop_id::sjd_pac:
      return sjd_decode_batch(target, prompts, sjd_opts(id, n), rngs, tree_verifier<>{}, {},
                              control);
    case loop_id::jacobi:
      return jacobi_decode_batch(target, prompts, jacobi_opts(n), rngs, {}, control);
    case loop_id::multiblock:
    case loop_id::multiblock_stochastic:
      return multiblock_decode_batch(target, prompts, mb_opts(id, n), rngs, tree_verifier<>{}, {},
                                     control);
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

std::vector<request_rng> rngs_for(std::size_t n, std::uint64_t seed) {
  std::vector<request_rng> r;
  for (std::size_t i = 0; i < n; ++i)
    r.push_back({seed + 17 * i, static_cast<std::uint32_t>(i), 0});
  return r;
}
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

TEST_CASE("decode faults: cancellation between passes, per-request limits and stop tokens",
          "[decode][faults][batch]") {
  const auto& t = toys();
  const auto rngs = rngs_for(4, 8);
  for (const loop_id id : all_loops) {
    INFO(name_of(id));
    batch_models m(t);
    const auto reference = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs);
    // Cancel request 1 once its target made 2 passes.
    m.clear();
    std::vector<request_outcome> outcomes(4);
    batch_control control;
    control.outcomes = outcomes;
    control.cancel = [&](index_t r) { return r == 1 && m.target.session(1).evaluates() >= 2; };
    const auto out = run_many(id, m.target, m.draft, batch_prompts(), 8, rngs, control);
    for (std::size_t r = 0; r < 4; ++r) {
      if (r == 1) {
        CHECK(outcomes[r].status == request_status::cancelled);
        CHECK(is_prefix(out[r], reference[r]));
        CHECK(out[r].size() < reference[r].size());
        const auto seq = concat(batch_prompts()[r], out[r]);
        check_cache(t.target, m.target.session(1).inner(), seq);
        if (has_draft(id)) check_cache(t.draft, m.draft.session(1).inner(), seq, true);
      } else {
        CHECK(outcomes[r].status == request_status::completed);
        CHECK(out[r] == reference[r]);
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
  const toy_masked_model masked(6, 4);
  std::vector<request_limits> two(2);
  two[0].max_new_tokens = 3;
  batch_control s;
  s.limits = two;
  ssd_options so;
  so.gen_length = 4;
  so.block_size = 2;
  const std::vector<std::vector<token_t>> prompts{{1, 2}, {3}};
  CHECK_THROWS_WITH(ssd_decode_batch(masked, prompts, so, {}, s), Catch::Contains("limits"));
}

TEST_CASE("decode faults: SSD and stepwise diffusion decoding", "[decode][faults]") {
  ssd_options o;
  o.gen_length = 8;
  o.block_size = 4;
  o.draft_length = 3;
  const std::vector<token_t> prompt{1, 2};
  const faulty_masked<toy_masked_model> clean{toy_masked_model(6, 9)};
  const auto reference = ssd_decode(clean, prompt, o);
  for (const fault_kind kind :
       {fault_kind::evaluate_throws, fault_kind::nan_logit, fault_kind::empty_row}) {
    for (std::int64_t at = 1; at <= 4; ++at) {
      INFO("fault " << static_cast<int>(kind) << " at " << at);
      faulty_masked<toy_masked_model> m{toy_masked_model(6, 9), {kind, at, 3, 2, false}};
      try {
        (void)ssd_decode(m, prompt, o);
        FAIL("no decode_error");
      } catch (const decode_error& e) {
        CHECK(e.source() == fault_source::target);
        CHECK(e.operation() == "evaluate");
        // The decoded positions so far are the reference's; the others still masked.
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
      // Batched with isolation: the faulty request alone is dropped.
      const std::vector<std::vector<token_t>> prompts{prompt, {3}, {4, 1, 2}};
      const auto clean_out = ssd_decode_batch(clean, prompts, o);
      faulty_masked<toy_masked_model> b{toy_masked_model(6, 9), {kind, at, 0, 2, false}};
      std::vector<request_outcome> outcomes(3);
      batch_control c;
      c.isolate = true;
      c.outcomes = outcomes;
      // Prompts of different lengths: one evaluate_sequences call per request, so the fault
      // hits one request (a throw inside a round of several is retried and succeeds).
      const auto out = ssd_decode_batch(b, prompts, o, {}, c);
      index_t failed = 0;
      for (std::size_t r = 0; r < 3; ++r) {
        if (outcomes[r].status == request_status::failed) {
          ++failed;
          continue;
        }
        CHECK(outcomes[r].status == request_status::completed);
        CHECK(out[r] == clean_out[r]);
      }
      CHECK(failed == (kind == fault_kind::evaluate_throws ? 0 : 1));
    }
  }
}

TEST_CASE(
    "decode faults: under classifier-free guidance both streams stay at the committed "
    "tokens",
    "[decode][faults][cfg]") {
  // No zero probabilities: CFG mixes two -inf logits into NaN.
  const toy_pair t{toy_ar_model(4, 7, 11, 0.0),
                   toy_ar_model::perturbed(toy_ar_model(4, 7, 11, 0.0), 0.5, 12, 0.0)};
  const std::vector<token_t> prompt{0, 2};
  const auto uncond = [](std::span<const token_t> p) {
    std::vector<token_t> u(p.begin(), p.end());
    u.insert(u.begin(), 1);  // a longer unconditional prompt
    return u;
  };
  for (const loop_id id : {loop_id::sd_chain, loop_id::sjd_pac, loop_id::jacobi}) {
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

/// Sequences of `law.horizon()` tokens from `runs` runs of loop `id` on a fresh request (BOS
/// prompt), each interrupted by a target fault at a random pass and resumed from its committed
/// tokens with a new stream; `corrupt`: the control, which resumes after changing the last
/// committed token.
std::vector<std::uint64_t> resumed_counts(loop_id id, const toy_pair& t, std::uint32_t runs,
                                          bool corrupt) {
  const toy_ar_model& law = t.target;
  const index_t n = law.horizon();
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(law.num_sequences()), 0);
  fsession target{toy_model_session(law)}, draft{toy_model_session(t.draft)};
  const std::vector<token_t> bos{0};
  for (std::uint32_t r = 0; r < runs; ++r) {
    const auto at = static_cast<std::int64_t>(1 + uniform_at(request_rng{99, r, 0}, draw_id{0, 0}) *
                                                      static_cast<double>(n));
    target.reset_counts();
    target.plan() = {fault_kind::evaluate_throws, at, 0, 0, false};
    std::vector<token_t> out;
    try {
      out = run_one(id, target, draft, bos, n, request_rng{7, r, 0});
    } catch (const decode_error& e) {
      out = e.committed()[0];
      target.plan() = {};
      if (corrupt && !out.empty()) out.back() = (out.back() + 1) % law.vocab_size();
      if (static_cast<index_t>(out.size()) < n) {
        const auto rest = run_one(id, target, draft, concat(bos, out),
                                  n - static_cast<index_t>(out.size()), request_rng{8, r, 0});
        out.insert(out.end(), rest.begin(), rest.end());
      }
    }
    ++counts[static_cast<std::size_t>(law.sequence_index(out))];
  }
  return counts;
}

}  // namespace

TEST_CASE("decode faults: resuming after a fault keeps the target's law (G-test)",
          "[decode][faults][stats]") {
  const toy_pair t{toy_ar_model(3, 4, 31),
                   toy_ar_model::perturbed(toy_ar_model(3, 4, 31), 0.6, 32)};
  const auto law = t.target.sequence_law();
  for (const loop_id id : {loop_id::sd_chain, loop_id::sd_tree, loop_id::sjd, loop_id::sjd_pac,
                           loop_id::multiblock_stochastic}) {
    INFO(name_of(id));
    const auto g = specula::testing::g_test(resumed_counts(id, t, 4000, false), law);
    INFO(g);
    CHECK(g.impossible_observations == 0);
    CHECK(g.p_value > 1e-4);
    const auto bad = specula::testing::g_test(resumed_counts(id, t, 4000, true), law);
    INFO("control " << bad);
    CHECK((bad.impossible_observations > 0 || bad.p_value < 1e-6));
  }
}
