// libFuzzer target: the decoding loops under a fuzzed fault schedule, on fuzzed toy models.
//
// The input picks a loop (SD chain / tree / greedy, SJD, SJD-PAC, Jacobi, multi-block greedy
// and stochastic), a toy target and draft model (vocabulary, horizon, seeds), one request or a
// batch of up to 4 (with or without isolation, per-request stop-token lists, a cancellation, a
// cancel callback that throws), a token budget and up to four faults (kind, call, row, column,
// which model and request, transient or sticky). Whatever happens, the loop
// must either finish or throw specula::decode_error (bad arguments: invalid_input), and then:
// every reported token is in range and the committed tokens are a prefix of the clean run's
// output; every model whose caches are reported consistent holds its request's committed
// sequence (the target all of it but the last token, a draft a prefix of it); with isolation,
// every request that did not fail equals the clean run.

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "specula/decode/batch.hpp"
#include "specula/decode/jacobi.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula/decode/sjd.hpp"
#include "specula/decode/speculative.hpp"
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

constexpr int loops = 8;

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in{data, size};
  const int loop = in.next() % loops;
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
  const index_t n = 1 + in.next() % 8;
  const testing::toy_ar_model target_law(V, horizon, seed);
  const auto draft_law = testing::toy_ar_model::perturbed(target_law, 0.5, seed + 1);

  std::vector<std::vector<token_t>> prompts(B);
  std::vector<request_rng> rngs;
  for (std::size_t r = 0; r < B; ++r) {
    prompts[r].push_back(0);
    const std::uint8_t extra = in.next() % 3;
    for (std::uint8_t i = 0; i < extra; ++i) prompts[r].push_back(in.next() % V);
    rngs.push_back({seed + r, static_cast<std::uint32_t>(r), 0});
  }
  const auto make = [&](const testing::toy_ar_model& law) {
    return fbatch(std::vector<fsession>(B, fsession{testing::toy_model_session(law)}));
  };
  // Per-request stop-token lists (the clean run has the same).
  std::vector<request_limits> limits(stop_lists ? B : 0);
  for (std::size_t r = 0; r < limits.size(); ++r) {
    limits[r].stop_tokens = std::vector<token_t>{static_cast<token_t>((seed + r) % V)};
    if (r % 2 == 1) limits[r].stop_tokens->push_back(static_cast<token_t>((seed + 2 * r) % V));
  }
  batch_control clean_control;
  clean_control.limits = limits;
  fbatch clean_t = make(target_law), clean_d = make(draft_law);
  const auto clean = run(loop, clean_t, clean_d, prompts, n, rngs, clean_control);

  fbatch target = make(target_law), draft = make(draft_law);
  std::vector<bool> faulty(B, false);
  for (int f = 0; f < 4 && in.at < in.size; ++f) {
    const auto kind = static_cast<fault_kind>(in.next() % testing::fault_kind_count);
    fault_plan plan{kind, 1 + in.next() % 24, in.next() % 16, in.next() % 8, false};
    const std::uint8_t where = in.next();
    plan.sticky = (where & 0x80) != 0;
    const auto r = static_cast<index_t>(where % B);
    const bool on_draft = sd && (where & 0x40) != 0;
    (on_draft ? draft : target).session(r).plan() = plan;
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
      if (cancel_throws && r == last && target.session(last).evaluates() >= 3)
        throw std::runtime_error("cancel callback fault");
      return cancel_one && r == 0 && target.session(0).evaluates() >= 2;
    };
  std::vector<std::vector<token_t>> committed;
  bool consistent = true;
  try {
    committed = run(loop, target, draft, prompts, n, rngs, control);
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
    check_cache(target.session(static_cast<index_t>(r)), seq, false);
    if (sd) check_cache(draft.session(static_cast<index_t>(r)), seq, true);
  }
  return 0;
}
