// The fused device logits -> probabilities transform (cuda/specula/cuda/transforms.cuh) against
// the host's specula::logits_to_probs: random rows and parameter combinations, ties at the
// top-k / top-p thresholds, fp32/bf16/fp16 inputs, batch-position invariance, determinism and
// the per-row statuses of bad input. Skips without a GPU.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "specula/cuda/error.cuh"
#include "specula/cuda/transforms.cuh"
#include "specula/sample/transforms.hpp"

using namespace specula;

namespace {

bool have_gpu() {
  if (specula::cuda::device_count() > 0) return true;
  WARN("no CUDA device: device transform checks skipped (compile-only)");
  return false;
}

/// Owning device buffer.
template <class T>
struct device_buffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit device_buffer(std::size_t count) : n(count) {
    specula::cuda::throw_on_error(cudaMalloc(&ptr, (count == 0 ? 1 : count) * sizeof(T)),
                                  "cudaMalloc");
  }
  explicit device_buffer(const std::vector<T>& v) : device_buffer(v.size()) {
    specula::cuda::throw_on_error(
        cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(ptr); }
  [[nodiscard]] std::vector<T> to_host() const {
    std::vector<T> v(n);
    specula::cuda::throw_on_error(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost),
                                  "cudaMemcpy");
    return v;
  }
};

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else
    return __float2bfloat16_rn(x);
}

template <class T>
float as_float(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else
    return __bfloat162float(x);
}

/// Random logits, N(0, scale^2).
std::vector<float> random_logits(std::size_t n, std::uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

/// Host reference of one row (inputs already as floats).
std::vector<float> host_probs(const sampling_params& sp, std::vector<float> logits,
                              const std::vector<float>& uncond) {
  std::vector<float> probs(logits.size()), scratch(logits.size());
  logits_to_probs(sp, logits, uncond, probs, scratch);
  return probs;
}

/// Runs the device transform on rows x cols inputs of type T (given as floats, rounded to T);
/// the host reference uses the same rounded values. Returns {device, host reference} per row.
struct run_result {
  std::vector<float> device;
  std::vector<float> host;
  std::vector<std::uint32_t> status;
};

template <class T>
run_result run_device(const std::vector<T>& logits, const std::vector<T>& uncond,
                      const std::vector<sampling_params>& params, index_t rows, index_t cols) {
  const device_buffer<T> d_logits(logits), d_uncond(uncond);
  const device_buffer<sampling_params> d_params(params);
  const device_buffer<float> d_out(static_cast<std::size_t>(rows * cols));
  const device_buffer<std::uint32_t> d_status(
      std::vector<std::uint32_t>(static_cast<std::size_t>(rows), 0xFFFFFFFFu));
  const index_t uncond_rows = uncond.empty() ? 0 : rows;
  const cudaError_t e = specula::cuda::logits_to_probs_async<T>(
      specula::cuda::par_on(nullptr), batch_view<const T>{d_logits.ptr, rows, cols},
      batch_view<const T>{d_uncond.ptr, uncond_rows, cols},
      row_view<const sampling_params>{d_params.ptr, static_cast<index_t>(params.size())},
      batch_view<float>{d_out.ptr, rows, cols}, d_status.ptr);
  REQUIRE(e == cudaSuccess);
  specula::cuda::throw_on_error(cudaDeviceSynchronize(), "logits_to_probs_async");
  return run_result{d_out.to_host(), {}, d_status.to_host()};
}

template <class T>
run_result run_both(const std::vector<float>& logits_f, const std::vector<float>& uncond_f,
                    const std::vector<sampling_params>& params, index_t rows, index_t cols) {
  std::vector<T> logits(logits_f.size()), uncond(uncond_f.size());
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = from_float<T>(logits_f[i]);
  for (std::size_t i = 0; i < uncond.size(); ++i) uncond[i] = from_float<T>(uncond_f[i]);
  run_result res = run_device<T>(logits, uncond, params, rows, cols);
  for (index_t r = 0; r < rows; ++r) {
    std::vector<float> row(static_cast<std::size_t>(cols)), urow;
    for (index_t c = 0; c < cols; ++c)
      row[static_cast<std::size_t>(c)] = as_float(logits[static_cast<std::size_t>(r * cols + c)]);
    if (!uncond.empty()) {
      urow.resize(static_cast<std::size_t>(cols));
      for (index_t c = 0; c < cols; ++c)
        urow[static_cast<std::size_t>(c)] =
            as_float(uncond[static_cast<std::size_t>(r * cols + c)]);
    }
    const auto& sp = params[params.size() == 1 ? 0 : static_cast<std::size_t>(r)];
    const auto ref = host_probs(sp, row, urow);
    res.host.insert(res.host.end(), ref.begin(), ref.end());
  }
  return res;
}

/// Entry-wise comparison: zeros must agree exactly (filter decisions), other entries within
/// `rel` relative error.
void compare(const std::vector<float>& device, const std::vector<float>& host, double rel,
             const std::string& what) {
  REQUIRE(device.size() == host.size());
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const double d = device[i], h = host[i];
    const bool ok = (h == 0.0) ? d == 0.0 : std::abs(d - h) <= rel * std::abs(h) + 1e-30;
    if (!ok && mismatches++ == 0) first = i;
  }
  INFO(what << ": " << mismatches << " mismatches; first at " << first << " device "
            << (device.empty() ? 0.0f : device[first]) << " host "
            << (host.empty() ? 0.0f : host[first]));
  CHECK(mismatches == 0);
}

sampling_params make(float temperature, index_t top_k, float top_p, float min_p,
                     float cfg_scale = 1.0f) {
  sampling_params sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  sp.cfg_scale = cfg_scale;
  return sp;
}

std::vector<sampling_params> parameter_grid() {
  return {
      make(1.0f, 0, 1.0f, 0.0f),     // plain softmax
      make(0.7f, 0, 1.0f, 0.0f),     // temperature
      make(1.0f, 50, 1.0f, 0.0f),    // top-k
      make(1.0f, 1, 1.0f, 0.0f),     // top-k = 1
      make(1.0f, 5000, 1.0f, 0.0f),  // top-k >= cols: no-op
      make(1.0f, 0, 0.9f, 0.0f),     // top-p
      make(1.3f, 0, 0.5f, 0.0f),     // top-p, flatter
      make(1.0f, 0, 1.0f, 0.05f),    // min-p
      make(0.7f, 50, 0.9f, 0.0f),    // the usual serving setting
      make(0.8f, 200, 0.95f, 0.02f)  // everything
  };
}

}  // namespace

TEST_CASE("device logits_to_probs matches the host on fp32 rows", "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t rows = 6, cols = 3001;
  for (const auto& sp : parameter_grid()) {
    const auto logits = random_logits(static_cast<std::size_t>(rows * cols), 11);
    const auto res = run_both<float>(logits, {}, {sp}, rows, cols);
    for (auto s : res.status) CHECK(s == 0u);
    compare(res.device, res.host, 1e-6,
            "T=" + std::to_string(sp.temperature) + " k=" + std::to_string(sp.top_k) +
                " p=" + std::to_string(sp.top_p) + " min_p=" + std::to_string(sp.min_p));
  }
}

TEST_CASE("device logits_to_probs matches the host on a 128256-token row", "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t rows = 2, cols = 128256;
  const auto logits = random_logits(static_cast<std::size_t>(rows * cols), 5, 2.0f);
  const auto res = run_both<float>(logits, {}, {make(0.7f, 50, 0.9f, 0.0f)}, rows, cols);
  compare(res.device, res.host, 1e-6, "V=128256");
  const auto res2 = run_both<float>(logits, {}, {make(1.0f, 0, 0.8f, 0.01f)}, rows, cols);
  compare(res2.device, res2.host, 1e-6, "V=128256 top-p + min-p");
  // Radix selects whose survivors never fit the shared candidate buffer (top-k above its 4096
  // values; a flat top-p whose lower bound stays low) against ones that gather early.
  for (const auto& sp : {make(1.0f, 5000, 1.0f, 0.0f), make(1.0f, 4000, 0.99f, 0.0f),
                         make(1.5f, 0, 0.999f, 0.0f), make(1.0f, 10, 0.5f, 0.0f)}) {
    const auto res3 = run_both<float>(logits, {}, {sp}, rows, cols);
    compare(res3.device, res3.host, 1e-6,
            "V=128256 k=" + std::to_string(sp.top_k) + " p=" + std::to_string(sp.top_p));
  }
}

namespace {

/// The device output of one row of T placed `offset` elements into its buffer (offset 0: 16-byte
/// aligned, as cudaMalloc returns; 1..3: not), with CFG rows at the same offset.
template <class T>
std::vector<float> row_at_offset(const std::vector<float>& row, const std::vector<float>& uncond,
                                 const sampling_params& sp, index_t offset) {
  const auto cols = static_cast<index_t>(row.size());
  std::vector<T> in(static_cast<std::size_t>(cols + offset), from_float<T>(0.0f)),
      un(uncond.empty() ? 0 : in.size(), from_float<T>(0.0f));
  for (index_t c = 0; c < cols; ++c) {
    in[static_cast<std::size_t>(offset + c)] = from_float<T>(row[static_cast<std::size_t>(c)]);
    if (!uncond.empty())
      un[static_cast<std::size_t>(offset + c)] = from_float<T>(uncond[static_cast<std::size_t>(c)]);
  }
  const device_buffer<T> d_in(in), d_un(un);
  const device_buffer<sampling_params> d_params(std::vector<sampling_params>{sp});
  // Initialised in full: the kernel writes only the row, and the lead is copied back too.
  const device_buffer<float> d_out(
      std::vector<float>(static_cast<std::size_t>(cols + offset), -1.0f));
  REQUIRE(specula::cuda::logits_to_probs_async<T>(
              specula::cuda::par_on(nullptr), batch_view<const T>{d_in.ptr + offset, 1, cols},
              batch_view<const T>{uncond.empty() ? nullptr : d_un.ptr + offset,
                                  uncond.empty() ? 0 : 1, cols},
              row_view<const sampling_params>{d_params.ptr, 1},
              batch_view<float>{d_out.ptr + offset, 1, cols}, nullptr) == cudaSuccess);
  specula::cuda::throw_on_error(cudaDeviceSynchronize(), "logits_to_probs_async");
  const auto out = d_out.to_host();
  return {out.begin() + offset, out.end()};
}

template <class T>
void check_alignment_invariance(const char* type) {
  // Lengths with and without a partial last chunk (4 fp32 / 8 bf16 logits per chunk).
  for (index_t cols : {4099, 4096, 32003}) {
    const auto row = random_logits(static_cast<std::size_t>(cols), 500 + cols);
    const auto uncond = random_logits(static_cast<std::size_t>(cols), 600 + cols);
    for (const auto& sp : {make(0.7f, 50, 0.9f, 0.05f), make(1.0f, 0, 0.999f, 0.0f)})
      for (const bool cfg : {false, true}) {
        const auto& un = cfg ? uncond : std::vector<float>{};
        const auto aligned = row_at_offset<T>(row, un, sp, 0);
        for (index_t offset = 1; offset < 4; ++offset) {
          INFO(type << " cols " << cols << " offset " << offset << " cfg " << cfg << " k "
                    << sp.top_k << " p " << sp.top_p);
          const auto shifted = row_at_offset<T>(row, un, sp, offset);
          CHECK(std::memcmp(aligned.data(), shifted.data(), aligned.size() * sizeof(float)) == 0);
        }
      }
  }
}

}  // namespace

TEST_CASE("device probabilities do not depend on the row's alignment (vector or scalar loads)",
          "[cuda][device]") {
  if (!have_gpu()) return;
  check_alignment_invariance<float>("fp32");
  check_alignment_invariance<__nv_bfloat16>("bf16");
  check_alignment_invariance<__half>("fp16");
}

TEST_CASE("device logits_to_probs with classifier-free guidance matches the host",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t rows = 4, cols = 2048;
  const auto cond = random_logits(static_cast<std::size_t>(rows * cols), 21);
  const auto uncond = random_logits(static_cast<std::size_t>(rows * cols), 22);
  // cfg_mix_op rounds each operation on its own on both backends (__fmul_rn / __fadd_rn on the
  // device), so the mixed logits are the host's bits and the fp32 tolerance applies.
  for (float s : {1.0f, 1.5f, 3.0f, 7.5f})
    for (const auto& base : {make(1.0f, 0, 1.0f, 0.0f), make(0.7f, 50, 0.9f, 0.0f)}) {
      auto sp = base;
      sp.cfg_scale = s;
      const auto res = run_both<float>(cond, uncond, {sp}, rows, cols);
      for (auto st : res.status) CHECK(st == 0u);
      compare(res.device, res.host, 1e-6, "cfg_scale=" + std::to_string(s));
    }
}

TEST_CASE("device logits_to_probs reads bf16 and fp16 logits directly", "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t rows = 3, cols = 32000;
  const auto logits = random_logits(static_cast<std::size_t>(rows * cols), 31);
  const auto uncond = random_logits(static_cast<std::size_t>(rows * cols), 32);
  for (const auto& sp : parameter_grid()) {
    const auto bf = run_both<__nv_bfloat16>(logits, {}, {sp}, rows, cols);
    compare(bf.device, bf.host, 1e-6, "bf16 k=" + std::to_string(sp.top_k));
    const auto hf = run_both<__half>(logits, {}, {sp}, rows, cols);
    compare(hf.device, hf.host, 1e-6, "fp16 k=" + std::to_string(sp.top_k));
  }
  auto sp = make(0.7f, 50, 0.9f, 0.0f, 2.0f);
  const auto cfg = run_both<__nv_bfloat16>(logits, uncond, {sp}, rows, cols);
  compare(cfg.device, cfg.host, 1e-6, "bf16 cfg");  // unfused CFG mix: see the fp32 CFG case
}

TEST_CASE("device top-k and top-p keep ties at their thresholds, as the host", "[cuda][device]") {
  if (!have_gpu()) return;
  // Logits from a small set (with -0 and +0): many ties everywhere, including the thresholds.
  const index_t rows = 5, cols = 1000;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> pick(0, 6);
  const float values[] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f, 3.0f};
  std::vector<float> logits(static_cast<std::size_t>(rows * cols));
  for (float& x : logits) x = values[pick(gen)];
  const std::vector<sampling_params> grid = {
      make(1.0f, 5, 1.0f, 0.0f),   make(1.0f, 150, 1.0f, 0.0f), make(1.0f, 400, 1.0f, 0.0f),
      make(1.0f, 600, 1.0f, 0.0f), make(1.0f, 0, 0.3f, 0.0f),   make(1.0f, 0, 0.6f, 0.0f),
      make(1.0f, 0, 0.9f, 0.0f),   make(1.0f, 0, 1.0f, 0.2f),   make(1.0f, 0, 1.0f, 0.37f),
      make(1.0f, 300, 0.7f, 0.1f)};
  for (const auto& sp : grid) {
    const auto res = run_both<float>(logits, {}, {sp}, rows, cols);
    compare(res.device, res.host, 1e-6,
            "ties k=" + std::to_string(sp.top_k) + " p=" + std::to_string(sp.top_p) +
                " min_p=" + std::to_string(sp.min_p));
    // Ties kept: the number of non-zero entries is at least k when top-k is the only filter
    // (top-p and min-p may keep fewer; the comparison with the host above covers those).
    if (sp.top_k > 0 && sp.top_p >= 1.0f && sp.min_p <= 0.0f)
      for (index_t r = 0; r < rows; ++r) {
        index_t kept = 0;
        for (index_t c = 0; c < cols; ++c)
          kept += res.device[static_cast<std::size_t>(r * cols + c)] > 0.0f ? 1 : 0;
        CHECK(kept >= sp.top_k);
      }
  }
}

TEST_CASE("device probabilities of a row do not depend on the rest of the batch",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t cols = 4099, stride = 4160;
  const auto row = random_logits(static_cast<std::size_t>(cols), 99);
  const sampling_params sp = make(0.7f, 50, 0.9f, 0.05f);

  // Alone, in a batch of one.
  const auto alone = run_both<float>(row, {}, {sp}, 1, cols).device;

  // At position 5 of 9 rows with other data and other per-row parameters, strided input and
  // output; the output padding must stay untouched.
  const index_t rows = 9, at = 5;
  std::vector<float> batch(static_cast<std::size_t>(rows * stride), 1.0f);
  std::vector<sampling_params> params;
  for (index_t r = 0; r < rows; ++r) {
    const auto other = random_logits(static_cast<std::size_t>(cols), 1000 + r, 1.0f + r);
    for (index_t c = 0; c < cols; ++c)
      batch[static_cast<std::size_t>(r * stride + c)] =
          r == at ? row[static_cast<std::size_t>(c)] : other[static_cast<std::size_t>(c)];
    params.push_back(r == at ? sp : make(1.0f + 0.1f * r, r * 7, 0.5f + 0.05f * r, 0.0f));
  }
  const device_buffer<float> d_in(batch);
  const device_buffer<sampling_params> d_params(params);
  const device_buffer<float> d_out(std::vector<float>(batch.size(), -7.0f));
  for (int rep = 0; rep < 2; ++rep) {
    REQUIRE(specula::cuda::logits_to_probs_async<float>(
                specula::cuda::par_on(nullptr),
                batch_view<const float>{d_in.ptr, rows, cols, stride}, {},
                row_view<const sampling_params>{d_params.ptr, rows},
                batch_view<float>{d_out.ptr, rows, cols, stride}, nullptr) == cudaSuccess);
    specula::cuda::throw_on_error(cudaDeviceSynchronize(), "logits_to_probs_async");
    const auto out = d_out.to_host();
    CHECK(std::memcmp(out.data() + at * stride, alone.data(),
                      static_cast<std::size_t>(cols) * sizeof(float)) == 0);
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = cols; c < stride; ++c)
        CHECK(out[static_cast<std::size_t>(r * stride + c)] == -7.0f);
  }
}

TEST_CASE("device logits_to_probs reports bad rows per row and fills them with NaN",
          "[cuda][bad_input][device]") {
  if (!have_gpu()) return;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const index_t cols = 700;
  std::vector<std::vector<float>> rows_in;
  std::vector<sampling_params> params;
  std::vector<status> expected;
  const auto add = [&](std::vector<float> row, sampling_params sp, status s) {
    rows_in.push_back(std::move(row));
    params.push_back(sp);
    expected.push_back(s);
  };
  const auto good = random_logits(static_cast<std::size_t>(cols), 3);
  const sampling_params ok = make(0.7f, 50, 0.9f, 0.0f);
  add(good, ok, status::ok);
  auto r_nan = good;
  r_nan[600] = nan;
  add(r_nan, ok, status::nan_value);
  auto r_inf = good;
  r_inf[5] = inf;
  add(r_inf, ok, status::inf_value);
  auto r_inf_then_nan = good;  // the first offender decides, as on the host
  r_inf_then_nan[10] = inf;
  r_inf_then_nan[11] = nan;
  add(r_inf_then_nan, ok, status::inf_value);
  auto r_nan_then_inf = good;
  r_nan_then_inf[10] = nan;
  r_nan_then_inf[11] = inf;
  add(r_nan_then_inf, ok, status::nan_value);
  add(std::vector<float>(static_cast<std::size_t>(cols), -inf), ok, status::no_mass);
  auto r_masked = good;  // partly masked: fine, masked tokens get 0
  for (index_t c = 0; c < cols; c += 3) r_masked[static_cast<std::size_t>(c)] = -inf;
  add(r_masked, ok, status::ok);
  add(good, make(0.0f, 0, 1.0f, 0.0f), status::invalid_parameter);
  add(good, make(nan, 0, 1.0f, 0.0f), status::invalid_parameter);
  add(good, make(1.0f, -1, 1.0f, 0.0f), status::invalid_parameter);
  add(good, make(1.0f, 0, 0.0f, 0.0f), status::invalid_parameter);
  add(good, make(1.0f, 0, 1.5f, 0.0f), status::invalid_parameter);
  add(good, make(1.0f, 0, 1.0f, -0.1f), status::invalid_parameter);
  add(good, make(1.0f, 0, 1.0f, 0.0f, inf), status::invalid_parameter);
  auto r_overflow = good;  // finite logits that overflow under a tiny temperature
  r_overflow[1] = 3e38f;
  add(r_overflow, make(0.5f, 0, 1.0f, 0.0f), status::inf_value);
  add(good, ok, status::ok);

  const auto rows = static_cast<index_t>(rows_in.size());
  std::vector<float> flat;
  for (const auto& r : rows_in) flat.insert(flat.end(), r.begin(), r.end());
  const auto res = run_device<float>(flat, {}, params, rows, cols);
  for (index_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    CHECK(res.status[static_cast<std::size_t>(r)] ==
          static_cast<std::uint32_t>(expected[static_cast<std::size_t>(r)]));
    const float* out = res.device.data() + r * cols;
    if (expected[static_cast<std::size_t>(r)] == status::ok) {
      const auto ref =
          host_probs(params[static_cast<std::size_t>(r)], rows_in[static_cast<std::size_t>(r)], {});
      compare(std::vector<float>(out, out + cols), ref, 1e-6, "good row among bad ones");
    } else {
      bool all_nan = true;
      for (index_t c = 0; c < cols; ++c) all_nan = all_nan && std::isnan(out[c]);
      CHECK(all_nan);
    }
  }
}

TEST_CASE("device logits_to_probs rejects inconsistent shapes before launching",
          "[cuda][bad_input][device]") {
  if (!have_gpu()) return;
  const device_buffer<float> d_in(std::vector<float>(64, 0.0f));
  const device_buffer<float> d_out(64);
  const device_buffer<sampling_params> d_params(std::vector<sampling_params>(2));
  const auto launch = [&](batch_view<const float> in, batch_view<float> out,
                          row_view<const sampling_params> p) {
    return specula::cuda::logits_to_probs_async<float>(specula::cuda::par_on(nullptr), in, {}, p,
                                                       out, nullptr);
  };
  const row_view<const sampling_params> one{d_params.ptr, 1};
  CHECK(launch({d_in.ptr, 2, 32}, {d_out.ptr, 2, 32}, one) == cudaSuccess);
  CHECK(launch({d_in.ptr, 2, 32}, {d_out.ptr, 1, 32}, one) == cudaErrorInvalidValue);
  CHECK(launch({d_in.ptr, 2, 32}, {d_out.ptr, 2, 31}, one) == cudaErrorInvalidValue);
  CHECK(launch({d_in.ptr, 2, 32, 16}, {d_out.ptr, 2, 32}, one) == cudaErrorInvalidValue);
  CHECK(launch({d_in.ptr, 2, 32}, {d_out.ptr, 2, 32}, {d_params.ptr, 3}) == cudaErrorInvalidValue);
  CHECK(launch({d_in.ptr, 2, 32}, {d_in.ptr, 2, 32}, one) == cudaErrorInvalidValue);  // aliasing
  CHECK(launch({nullptr, 2, 32}, {d_out.ptr, 2, 32}, one) == cudaErrorInvalidValue);
  CHECK(launch({nullptr, 0, 32}, {nullptr, 0, 32}, {}) == cudaSuccess);  // nothing to do
  specula::cuda::throw_on_error(cudaDeviceSynchronize(), "logits_to_probs_async");

  // The checked wrapper names the argument, or the first bad row after synchronising.
  CHECK_THROWS_WITH(
      specula::cuda::logits_to_probs_checked<float>(specula::cuda::par_on(nullptr),
                                                    {d_in.ptr, 2, 32}, {}, one, {d_out.ptr, 1, 32}),
      Catch::Contains("probs_out"));
  std::vector<float> bad(64, 0.0f);
  bad[40] = std::numeric_limits<float>::quiet_NaN();
  const device_buffer<float> d_bad(bad);
  try {
    specula::cuda::logits_to_probs_checked<float>(specula::cuda::par_on(nullptr),
                                                  {d_bad.ptr, 2, 32}, {}, one, {d_out.ptr, 2, 32});
    FAIL("expected invalid_input");
  } catch (const invalid_input& e) {
    CHECK(e.code() == status::nan_value);
    CHECK(e.row() == 1);
    CHECK(e.argument() == "logits");
  }
  CHECK_NOTHROW(specula::cuda::logits_to_probs_checked<float>(
      specula::cuda::par_on(nullptr), {d_in.ptr, 2, 32}, {}, one, {d_out.ptr, 2, 32}));
}
