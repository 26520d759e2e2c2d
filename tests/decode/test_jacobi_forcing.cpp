// Jacobi Forcing training helpers: the Eq. 7 schedule against hand-computed values, trajectory
// point selection, packed layout, position ids, and the attention masks against a naive
// construction written here from the paper's rules (Fig. 2, Eq. 8, §4.3).

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "specula/decode/jacobi_forcing.hpp"

using namespace specula;
using idx = std::vector<index_t>;
using toks = std::vector<token_t>;

namespace {

constexpr index_t big = std::numeric_limits<index_t>::max();

// Runs f, which must throw invalid_input naming `argument`.
void require_invalid(const std::function<void()>& f, const std::string& argument) {
  INFO("expected invalid_input naming " << argument);
  bool thrown = false;
  try {
    f();
  } catch (const invalid_input& e) {
    thrown = true;
    CHECK(e.argument() == argument);
    CHECK(std::string(e.what()).find(argument) != std::string::npos);
  }
  CHECK(thrown);
}

// --- Naive reference, written from the rules, not from the code under test ------------------

enum class kind { prompt, noisy, clean };
struct naive_slot {
  kind k;
  index_t block;   // -1 for the prompt
  index_t offset;  // offset in the block, or prompt position
};

// The packed order [prompt, noisy 0, clean 0, noisy 1, clean 1, ...] built by appending.
std::vector<naive_slot> naive_layout(index_t prompt, index_t blocks, index_t n) {
  std::vector<naive_slot> s;
  for (index_t i = 0; i < prompt; ++i) s.push_back({kind::prompt, -1, i});
  for (index_t b = 0; b < blocks; ++b) {
    for (index_t r = 0; r < n; ++r) s.push_back({kind::noisy, b, r});
    for (index_t r = 0; r < n; ++r) s.push_back({kind::clean, b, r});
  }
  return s;
}

// Does query slot q attend to key slot k? `mask` 0 = NC (Fig. 2b), 1 = clean context (Fig. 2a),
// 2 = NC-IC with window w (§4.3).
bool naive_attends(const naive_slot& q, const naive_slot& k, int mask, index_t w) {
  if (q.k == kind::prompt) return k.k == kind::prompt && k.offset <= q.offset;  // causal prompt
  if (k.k == kind::prompt) return true;                                         // sees prompt
  if (k.block == q.block) return k.k == q.k && k.offset <= q.offset;  // own copy, causally
  if (k.block > q.block) return false;                                // never later blocks
  // k is an earlier block (k.block < q.block).
  if (q.k == kind::clean) return k.k == kind::clean;  // teacher: earlier clean blocks
  switch (mask) {
    case 0:
      return k.k == kind::noisy;  // student of Eq. 8: earlier noisy blocks
    case 1:
      return k.k == kind::clean;  // Fig. 2a: earlier clean blocks
    default: {
      const bool same_window = k.block / w == q.block / w;
      return same_window ? k.k == kind::noisy : k.k == kind::clean;
    }
  }
}

bool bit(const std::vector<std::uint64_t>& m, index_t words, index_t i, index_t j) {
  return ((m[static_cast<std::size_t>(i * words + j / 64)] >> (j % 64)) & 1U) != 0;
}

// Compares every bit of every row (padding bits of the last word included) with the reference.
void check_against_naive(index_t prompt, index_t blocks, index_t n, jacobi_mask_kind kind_arg,
                         int mask, index_t w) {
  INFO("P=" << prompt << " N=" << blocks << " n=" << n << " mask=" << mask << " w=" << w);
  const jacobi_packing pk(prompt, blocks, n);
  const auto ref = naive_layout(prompt, blocks, n);
  const auto size = static_cast<index_t>(ref.size());
  REQUIRE(pk.size() == size);
  const index_t words = (size + 63) / 64;
  REQUIRE(pk.mask_words() == words);
  const auto m = pk.attention_mask(kind_arg, w);
  REQUIRE(static_cast<index_t>(m.size()) == size * words);
  index_t mismatches = 0;
  for (index_t i = 0; i < size; ++i)
    for (index_t j = 0; j < words * 64; ++j) {
      const bool expected = j < size && naive_attends(ref[static_cast<std::size_t>(i)],
                                                      ref[static_cast<std::size_t>(j)], mask, w);
      if (bit(m, words, i, j) != expected) ++mismatches;
    }
  CHECK(mismatches == 0);
}

std::string row_string(const std::vector<std::uint64_t>& m, index_t words, index_t i,
                       index_t size) {
  std::string s;
  for (index_t j = 0; j < size; ++j) s += bit(m, words, i, j) ? '1' : '0';
  return s;
}

}  // namespace

TEST_CASE("Eq. 7 noise ratios t_b = W[b mod w], W = {0, 1/w, ..., (w-1)/w}", "[decode]") {
  // w = 4: W = {0, 1/4, 2/4, 3/4}; blocks 0..9 -> j = b mod 4 = 0,1,2,3,0,1,2,3,0,1.
  const std::vector<double> w4 = {0.0, 0.25, 0.5, 0.75, 0.0, 0.25, 0.5, 0.75, 0.0, 0.25};
  CHECK(progressive_noise_schedule(10, 4) == w4);
  // w = 8, block 11: j = 11 mod 8 = 3, t = 3/8 = 0.375 (exact in binary).
  CHECK(progressive_noise_ratio(11, 8) == 0.375);
  CHECK(progressive_noise_step(11, 8) == 3);
  // w = 1: W = {0}, every block clean.
  CHECK(progressive_noise_schedule(3, 1) == std::vector<double>{0.0, 0.0, 0.0});
  // w = 3: W = {0, 1/3, 2/3}; block 5 -> j = 2 -> 2/3 (same double as 2.0 / 3.0).
  CHECK(progressive_noise_ratio(5, 3) == 2.0 / 3.0);
  // The maximum of Eq. 7 is (w-1)/w, never 1: w = 16 -> 15/16 = 0.9375 at block 15.
  CHECK(progressive_noise_ratio(15, 16) == 0.9375);
  CHECK(progressive_noise_ratio(16, 16) == 0.0);
  CHECK(progressive_noise_schedule(0, 4).empty());
}

TEST_CASE("Eq. 7 noisy-token counts are ceil(t_b * n)", "[decode]") {
  // Paper round 1: n = 16, w = 16. ceil(j * 16 / 16) = j, so blocks 0..17 -> 0..15, 0, 1.
  idx r1;
  for (index_t j = 0; j < 16; ++j) r1.push_back(j);
  r1.push_back(0);
  r1.push_back(1);
  CHECK(progressive_noisy_counts(18, 16, 16) == r1);
  // Paper round 2: n = 32, w = 8. ceil(j * 32 / 8) = 4j: 0, 4, 8, ..., 28, then 0 again.
  CHECK(progressive_noisy_counts(9, 32, 8) == idx{0, 4, 8, 12, 16, 20, 24, 28, 0});
  // n = 16, w = 3: j=0 -> 0; j=1 -> ceil(16/3 = 5.33) = 6; j=2 -> ceil(32/3 = 10.67) = 11.
  CHECK(progressive_noisy_counts(7, 16, 3) == idx{0, 6, 11, 0, 6, 11, 0});
  // n = 7, w = 5: ceil(0) = 0, ceil(7/5 = 1.4) = 2, ceil(14/5 = 2.8) = 3, ceil(21/5 = 4.2) = 5,
  // ceil(28/5 = 5.6) = 6.
  CHECK(progressive_noisy_counts(5, 7, 5) == idx{0, 2, 3, 5, 6});
  // w > n: n = 4, w = 8: ceil(4j/8) = ceil(j/2) -> 0, 1 (0.5), 1, 2 (1.5), 2, 3 (2.5), 3, 4 (3.5).
  CHECK(progressive_noisy_counts(8, 4, 8) == idx{0, 1, 1, 2, 2, 3, 3, 4});
  // Single values, including a block far into the sequence: b = 1000, w = 16 -> j = 1000 mod 16
  // = 8 (16 * 62 = 992); n = 64 -> ceil(8 * 64 / 16) = 32.
  CHECK(progressive_noisy_count(1000, 64, 16) == 32);
  CHECK(progressive_noisy_count(0, 64, 16) == 0);
  // No overflow at the edge: n = max, w = 2, j = 1 -> ceil(max / 2) = max / 2 + 1 (max is odd).
  CHECK(progressive_noisy_count(1, big, 2) == big / 2 + 1);
  CHECK(progressive_noisy_counts(0, 4, 4).empty());
}

TEST_CASE("trajectory point selection: closest unconverged count, ties to the earliest",
          "[decode]") {
  const toks fixed = {1, 2, 3, 4};
  CHECK(count_unconverged(toks{1, 9, 3, 9}, fixed) == 2);
  CHECK(count_unconverged(fixed, fixed) == 0);
  // Four points with 4, 3, 1 and 0 unconverged tokens.
  const toks traj = {9, 9, 9, 9, /**/ 1, 9, 9, 9, /**/ 1, 2, 9, 4, /**/ 1, 2, 3, 4};
  CHECK(select_trajectory_point(traj, fixed, 4) == 0);
  CHECK(select_trajectory_point(traj, fixed, 3) == 1);
  CHECK(select_trajectory_point(traj, fixed, 2) == 1);  // |3-2| = |1-2| = 1: earliest wins
  CHECK(select_trajectory_point(traj, fixed, 1) == 2);
  CHECK(select_trajectory_point(traj, fixed, 0) == 3);
  CHECK(select_trajectory_point(toks{1, 2, 3, 4}, fixed, 4) == 0);  // a single point
}

TEST_CASE("noise selection: the paper's text, the released data preparation and Table 4",
          "[decode]") {
  const auto paper = jacobi_noise_options::paper();
  const auto released = jacobi_noise_options::released();
  const auto ratios = [](index_t blocks, index_t n, index_t w, const jacobi_noise_options& o) {
    std::vector<double> t;
    for (index_t b = 0; b < blocks; ++b) t.push_back(jacobi_noise_for(b, n, w, o).ratio);
    return t;
  };
  const auto counts = [](index_t blocks, index_t n, index_t w, const jacobi_noise_options& o) {
    idx c;
    for (index_t b = 0; b < blocks; ++b) c.push_back(jacobi_noise_for(b, n, w, o).count);
    return c;
  };
  // Eq. 7 with w = 4: {0, 1/4, 2/4, 3/4}; released: linspace(0, 1, 4) = {0, 1/3, 2/3, 1}.
  CHECK(ratios(5, 8, 4, paper) == std::vector<double>{0.0, 0.25, 0.5, 0.75, 0.0});
  CHECK(ratios(5, 8, 4, released) == std::vector<double>{0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0, 0.0});
  // Round 2 of the paper (n = 32, w = 8): Eq. 7 stops at 28 of 32 noisy tokens, the released
  // schedule reaches 32 (ceil(32 j / 7): 0, 5 (4.57), 10 (9.14), 14 (13.7), 19 (18.3),
  // 23 (22.9), 28 (27.4), 32).
  CHECK(counts(8, 32, 8, paper) == idx{0, 4, 8, 12, 16, 20, 24, 28});
  CHECK(counts(8, 32, 8, released) == idx{0, 5, 10, 14, 19, 23, 28, 32});
  // Reverse progressive falls across each window.
  auto rev = paper;
  rev.schedule = jacobi_noise_schedule::reverse;
  CHECK(ratios(5, 8, 4, rev) == std::vector<double>{0.75, 0.5, 0.25, 0.0, 0.75});
  auto rev_released = released;
  rev_released.schedule = jacobi_noise_schedule::reverse;
  CHECK(ratios(4, 8, 4, rev_released) == std::vector<double>{1.0, 2.0 / 3.0, 1.0 / 3.0, 0.0});
  // Other end points: linspace(0.2, 0.8, 3) = {0.2, 0.5, 0.8}; n = 10 -> counts 2, 5, 8 (no
  // rounding error pushes 0.2 * 10 above 2).
  auto mid = released;
  mid.t_min = 0.2;
  mid.t_max = 0.8;
  CHECK(ratios(3, 10, 3, mid) == std::vector<double>{0.2, 0.2 + 0.3, 0.8});
  CHECK(counts(3, 10, 3, mid) == idx{2, 5, 8});
  // w = 1 holds t_min only.
  CHECK(counts(2, 8, 1, released) == idx{0, 0});
  // Random: each block one of the window's points, from its own stream (deterministic in the
  // seed, every point drawn over many blocks, different seeds differ).
  auto rnd = released;
  rnd.schedule = jacobi_noise_schedule::random;
  rnd.seed = 7;
  std::vector<int> seen(4, 0);
  idx first, again, other;
  for (index_t b = 0; b < 400; ++b) {
    const auto t = jacobi_noise_for(b, 6, 4, rnd);
    REQUIRE(t.step >= 0);
    REQUIRE(t.step < 4);
    CHECK(t.ratio == ratios(4, 6, 4, released)[static_cast<std::size_t>(t.step)]);
    ++seen[static_cast<std::size_t>(t.step)];
    first.push_back(t.step);
    again.push_back(jacobi_noise_for(b, 6, 4, rnd).step);
  }
  rnd.seed = 8;
  for (index_t b = 0; b < 400; ++b) other.push_back(jacobi_noise_for(b, 6, 4, rnd).step);
  CHECK(first == again);
  CHECK(first != other);
  for (const int k : seen) CHECK(k > 50);  // 100 expected per point

  // Counting a point's noise: mismatching positions (footnote 2) or everything from the first
  // mismatch on (released).
  const toks fixed = {1, 2, 3, 4, 5, 6, 7, 8};
  const toks point = {1, 2, 9, 4, 5, 6, 9, 8};  // mismatches at 2 and 6
  CHECK(count_noisy(point, fixed, jacobi_noise_count::mismatches) == 2);
  CHECK(count_noisy(point, fixed, jacobi_noise_count::suffix) == 6);  // 8 - first mismatch 2
  CHECK(count_noisy(fixed, fixed, jacobi_noise_count::suffix) == 0);

  // Matching: points with suffix counts 8, 6, 3, 2, 0 (ratios 1, 0.75, 0.375, 0.25, 0) and t =
  // 0.3, n = 8. ceil(0.3 * 8) = 3 picks the count-3 point; the nearest ratio is 0.25 (|0.05|
  // against |0.075|), the count-2 point.
  const toks traj = {9,      9, 9, 9, 9, 9, 9, 9, /**/ 1, 2, 9, 9, 9, 9, 9, 9,
                     /**/ 1, 2, 3, 4, 5, 9, 7, 9, /**/ 1, 2, 3, 4, 5, 6, 9, 9,
                     /**/ 1, 2, 3, 4, 5, 6, 7, 8};
  const jacobi_noise_target t03{0, 0.3, 3};
  auto suffix_ceil = paper;
  suffix_ceil.count = jacobi_noise_count::suffix;
  CHECK(select_noisy_view(traj, fixed, t03, suffix_ceil) == 2);
  CHECK(select_noisy_view(traj, fixed, t03, released) == 3);
  // The paper's default (mismatch count, ceil) equals select_trajectory_point: mismatch counts
  // are 8, 6, 2, 2, 0 -> target 3 is 1 away from the count-2 point at index 2 (earliest).
  CHECK(select_noisy_view(traj, fixed, t03, paper) == select_trajectory_point(traj, fixed, 3));
  CHECK(select_noisy_view(traj, fixed, t03, paper) == 2);
  // Ties go to the earliest point: t = 0.875 is 0.125 from both 1 and 0.75.
  CHECK(select_noisy_view(traj, fixed, {0, 0.875, 7}, released) == 0);

  // Bad arguments name the argument.
  auto bad = released;
  bad.t_min = 0.9;
  bad.t_max = 0.5;
  CHECK_THROWS_WITH(jacobi_noise_for(0, 8, 4, bad), Catch::Contains("options.t_max"));
  bad.t_min = -0.1;
  CHECK_THROWS_WITH(jacobi_noise_for(0, 8, 4, bad), Catch::Contains("options.t_min"));
  CHECK_THROWS_WITH(select_noisy_view(traj, fixed, {0, 1.5, 3}, released),
                    Catch::Contains("target"));
  CHECK_THROWS_WITH(select_noisy_view(toks{1, 2, 3}, fixed, t03, released),
                    Catch::Contains("trajectory"));
  CHECK_THROWS_WITH(count_noisy(toks{1, 2}, fixed, jacobi_noise_count::suffix),
                    Catch::Contains("point"));
}

TEST_CASE("packed layout, slots and shared position ids", "[decode]") {
  // P = 3, N = 2, n = 2: [p0 p1 p2 | noisy0 (2) | clean0 (2) | noisy1 (2) | clean1 (2)].
  const jacobi_packing pk(3, 2, 2);
  CHECK(pk.size() == 3 + 2 * 2 * 2);
  CHECK(pk.generation_length() == 4);
  CHECK(pk.mask_words() == 1);
  CHECK(pk.noisy_begin(0) == 3);
  CHECK(pk.clean_begin(0) == 5);
  CHECK(pk.noisy_begin(1) == 7);
  CHECK(pk.clean_begin(1) == 9);
  // Prompt 0,1,2; block 0 at generation positions 3,4 (twice); block 1 at 5,6 (twice).
  CHECK(pk.position_ids() == idx{0, 1, 2, 3, 4, 3, 4, 5, 6, 5, 6});
  CHECK(pk.position_ids(10) == idx{10, 11, 12, 13, 14, 13, 14, 15, 16, 15, 16});

  const auto ref = naive_layout(3, 2, 2);
  for (index_t i = 0; i < pk.size(); ++i) {
    const auto s = pk.slot(i);
    const auto& r = ref[static_cast<std::size_t>(i)];
    const auto expected_kind = r.k == kind::prompt  ? jacobi_slot_kind::prompt
                               : r.k == kind::noisy ? jacobi_slot_kind::noisy
                                                    : jacobi_slot_kind::clean;
    CHECK(s.kind == expected_kind);
    CHECK(s.block == r.block);
    CHECK(s.offset == r.offset);
  }

  // Position ids for a larger layout: every noisy/clean slot sits at P + b*n + r.
  const jacobi_packing big_pk(5, 7, 3);
  const auto pos = big_pk.position_ids();
  const auto big_ref = naive_layout(5, 7, 3);
  REQUIRE(pos.size() == big_ref.size());
  for (std::size_t i = 0; i < pos.size(); ++i) {
    const auto& r = big_ref[i];
    CHECK(pos[i] == (r.k == kind::prompt ? r.offset : 5 + r.block * 3 + r.offset));
  }

  const jacobi_packing empty(0, 0, 4);
  CHECK(empty.size() == 0);
  CHECK(empty.position_ids().empty());
  CHECK(empty.attention_mask().empty());
}

TEST_CASE("packed tokens and per-block noisy counts", "[decode]") {
  const jacobi_packing pk(3, 2, 2);
  const toks prompt = {100, 101, 102};
  const toks clean = {1, 2, 3, 4};
  const toks noisy = {9, 2, 9, 9};  // block 0: 1 unconverged token; block 1: 2
  CHECK(pk.pack_tokens(prompt, clean, noisy) == toks{100, 101, 102, 9, 2, 1, 2, 9, 9, 3, 4});
  CHECK(pk.noisy_counts(clean, noisy) == idx{1, 2});
  // Longer output buffers: only the first size() tokens are written.
  toks out(13, -7);
  pk.pack_tokens(prompt, clean, noisy, out);
  CHECK(out == toks{100, 101, 102, 9, 2, 1, 2, 9, 9, 3, 4, -7, -7});
}

TEST_CASE("noise-aware masks on a small example, written out by hand", "[decode]") {
  // P = 1, N = 2, n = 2. Slots: 0 prompt | 1,2 noisy0 | 3,4 clean0 | 5,6 noisy1 | 7,8 clean1.
  const jacobi_packing pk(1, 2, 2);
  const index_t size = pk.size();
  const auto nc = pk.attention_mask();
  const std::vector<std::string> nc_rows = {
      "100000000",  // prompt: causal
      "110000000",  // noisy0 r0: prompt, itself
      "111000000",  // noisy0 r1: prompt, noisy0 r0..r1
      "100100000",  // clean0 r0: prompt, itself
      "100110000",  // clean0 r1: prompt, clean0 r0..r1
      "111001000",  // noisy1 r0: prompt, noisy0 (Eq. 8 student), itself
      "111001100",  // noisy1 r1
      "100110010",  // clean1 r0: prompt, clean0 (teacher), itself
      "100110011",  // clean1 r1
  };
  for (index_t i = 0; i < size; ++i)
    CHECK(row_string(nc, 1, i, size) == nc_rows[static_cast<std::size_t>(i)]);

  // Fig. 2a: noisy block 1 sees clean block 0 instead; every other row is unchanged.
  const auto cc = pk.attention_mask(jacobi_mask_kind::clean_conditioned);
  for (index_t i = 0; i < size; ++i) {
    std::string expected = nc_rows[static_cast<std::size_t>(i)];
    if (i == 5) expected = "100111000";
    if (i == 6) expected = "100111100";
    CHECK(row_string(cc, 1, i, size) == expected);
  }

  // NC-IC with w = 1: every earlier block is in an earlier window -> same as Fig. 2a;
  // with w = 2 both blocks share window 0 -> same as NC.
  CHECK(pk.attention_mask(jacobi_mask_kind::noise_conditioned_intra_window_clean, 1) == cc);
  CHECK(pk.attention_mask(jacobi_mask_kind::noise_conditioned_intra_window_clean, 2) == nc);

  // The span overload overwrites whatever was in the buffer.
  std::vector<std::uint64_t> buf(static_cast<std::size_t>(size), ~std::uint64_t{0});
  pk.attention_mask(buf);
  CHECK(buf == nc);
}

TEST_CASE("noise-aware masks match a naive construction from the rules", "[decode]") {
  struct shape {
    index_t prompt, blocks, n;
  };
  // Sizes below, at and across 64-bit word boundaries (e.g. 0 + 2*2*16 = 64, 5 + 2*4*16 = 133).
  const std::vector<shape> shapes = {{0, 1, 1},  {3, 0, 4}, {1, 2, 2},  {0, 2, 16},
                                     {5, 4, 16}, {7, 5, 3}, {64, 1, 1}, {63, 3, 11},
                                     {2, 9, 8},  {0, 6, 5}, {40, 3, 32}};
  for (const auto& s : shapes) {
    check_against_naive(s.prompt, s.blocks, s.n, jacobi_mask_kind::noise_conditioned, 0, 0);
    check_against_naive(s.prompt, s.blocks, s.n, jacobi_mask_kind::clean_conditioned, 1, 0);
    for (index_t w : {1, 2, 3, 16})
      check_against_naive(s.prompt, s.blocks, s.n,
                          jacobi_mask_kind::noise_conditioned_intra_window_clean, 2, w);
  }
}

TEST_CASE("bad arguments throw invalid_input naming the argument", "[decode]") {
  // Schedule.
  require_invalid([] { (void)progressive_noise_step(-1, 4); }, "block");
  require_invalid([] { (void)progressive_noise_step(0, 0); }, "window");
  require_invalid([] { (void)progressive_noise_ratio(-1, 4); }, "block");
  require_invalid([] { (void)progressive_noise_ratio(2, -3); }, "window");
  require_invalid([] { (void)progressive_noisy_count(-1, 4, 4); }, "block");
  require_invalid([] { (void)progressive_noisy_count(0, 0, 4); }, "block_size");
  require_invalid([] { (void)progressive_noisy_count(0, 4, 0); }, "window");
  require_invalid([] { (void)progressive_noisy_count(0, big, 3); }, "window");  // (w-1)*n
  require_invalid([] { (void)progressive_noise_schedule(-1, 4); }, "num_blocks");
  require_invalid([] { (void)progressive_noise_schedule(3, 0); }, "window");
  require_invalid([] { (void)progressive_noisy_counts(-1, 4, 4); }, "num_blocks");
  require_invalid([] { (void)progressive_noisy_counts(3, 0, 4); }, "block_size");
  require_invalid([] { (void)progressive_noisy_counts(3, 4, 0); }, "window");
  require_invalid([] { (void)progressive_noisy_counts(3, big, 3); }, "window");

  // Trajectory selection.
  const toks fixed = {1, 2, 3, 4};
  require_invalid([&] { (void)count_unconverged(toks{1, 2, 3}, fixed); }, "point");
  require_invalid([] { (void)select_trajectory_point(toks{1}, toks{}, 0); }, "fixed_point");
  require_invalid([&] { (void)select_trajectory_point(toks{}, fixed, 0); }, "trajectory");
  require_invalid(
      [&] {
        (void)select_trajectory_point(toks{1, 2, 3, 4, 5}, fixed, 0);
      },
      "trajectory");
  require_invalid([&] { (void)select_trajectory_point(fixed, fixed, -1); }, "target_noisy");
  require_invalid([&] { (void)select_trajectory_point(fixed, fixed, 5); }, "target_noisy");

  // Packing.
  require_invalid([] { (void)jacobi_packing(-1, 1, 1); }, "prompt_length");
  require_invalid([] { (void)jacobi_packing(0, -1, 1); }, "num_blocks");
  require_invalid([] { (void)jacobi_packing(0, 1, 0); }, "block_size");
  require_invalid([] { (void)jacobi_packing(0, big / 2, 2); }, "num_blocks");  // size overflows
  const jacobi_packing pk(3, 2, 2);
  require_invalid([&] { (void)pk.noisy_begin(-1); }, "block");
  require_invalid([&] { (void)pk.noisy_begin(2); }, "block");
  require_invalid([&] { (void)pk.clean_begin(2); }, "block");
  require_invalid([&] { (void)pk.slot(-1); }, "slot");
  require_invalid([&] { (void)pk.slot(pk.size()); }, "slot");
  std::vector<std::uint64_t> short_mask(static_cast<std::size_t>(pk.size() - 1));
  require_invalid([&] { pk.attention_mask(short_mask); }, "out");
  require_invalid(
      [&] { (void)pk.attention_mask(jacobi_mask_kind::noise_conditioned_intra_window_clean, 0); },
      "window");
  const toks prompt = {100, 101, 102};
  const toks clean = {1, 2, 3, 4};
  require_invalid([&] { (void)pk.pack_tokens(toks{100, 101}, clean, clean); }, "prompt");
  require_invalid([&] { (void)pk.pack_tokens(prompt, toks{1, 2, 3}, clean); }, "clean");
  require_invalid([&] { (void)pk.pack_tokens(prompt, clean, toks{1, 2, 3, 4, 5}); }, "noisy");
  toks short_out(static_cast<std::size_t>(pk.size() - 1));
  require_invalid([&] { pk.pack_tokens(prompt, clean, clean, short_out); }, "out");
  require_invalid([&] { (void)pk.noisy_counts(toks{1}, clean); }, "clean");
  require_invalid([&] { (void)pk.noisy_counts(clean, toks{1}); }, "noisy");
}
