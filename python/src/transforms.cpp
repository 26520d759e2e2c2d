// Logits -> probabilities (CFG, temperature, top-k, top-p, min-p) over fp32/bf16/fp16 rows.

#include <string>
#include <vector>

#include "common.hpp"

namespace specula::python {

namespace {

constexpr nb::dlpack::dtype bfloat16_dtype{
    static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
constexpr nb::dlpack::dtype half_dtype{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16,
                                       1};

thread_local std::vector<sampling_params> params_buffer;

/// Sets field `set(params[r], v)` for every row from a Python number or a 1-D array of `rows`
/// entries; returns whether the argument had one entry per row.
template <class Set>
bool fill_param(nb::handle h, const char* name, index_t rows, Set set) {
  if (is_scalar(h)) {
    const double v = nb::cast<double>(h);
    for (auto& p : params_buffer) set(p, v);
    return false;
  }
  const array a = import_array(h, name);
  require_contiguous(a, name);
  if (a.ndim() != 1 || static_cast<index_t>(a.shape(0)) != rows)
    value_error(std::string("specula: ") + name + " must be a number or have shape (rows,) = (" +
                std::to_string(rows) + ",)");
  params_buffer.resize(static_cast<std::size_t>(rows), params_buffer.front());
  auto fill = [&](const auto* p) {
    for (index_t r = 0; r < rows; ++r)
      set(params_buffer[static_cast<std::size_t>(r)], static_cast<double>(p[r]));
  };
  if (has_dtype<float>(a))
    fill(static_cast<const float*>(a.data()));
  else if (has_dtype<double>(a))
    fill(static_cast<const double*>(a.data()));
  else if (has_dtype<std::int64_t>(a))
    fill(static_cast<const std::int64_t*>(a.data()));
  else if (has_dtype<std::int32_t>(a))
    fill(static_cast<const std::int32_t*>(a.data()));
  else
    type_error(std::string("specula: ") + name +
               " must have dtype float32, float64, int32 or int64 (got " + dtype_name(a.dtype()) +
               ")");
  return true;
}

void logits_to_probs_binding(nb::handle logits_arg, nb::handle uncond_arg, nb::handle temperature,
                             nb::handle top_k, nb::handle top_p, nb::handle min_p,
                             nb::handle cfg_scale, nb::handle probs_arg, int threads) {
  clear_pointers();
  const array logits = import_array(logits_arg, "logits");
  const array uncond = import_optional(uncond_arg, "uncond");
  const array probs = import_array(probs_arg, "probs", true);
  require_dtype<float>(probs, "probs", "float32");
  if (uncond.is_valid() && uncond.dtype() != logits.dtype())
    type_error("specula: uncond must have the dtype of logits (" + dtype_name(logits.dtype()) +
               "; got " + dtype_name(uncond.dtype()) + ")");
  if (logits.ndim() < 1) value_error("specula: logits must have shape (..., V)");
  index_t rows = 1;
  for (std::size_t d = 0; d + 1 < logits.ndim(); ++d) rows *= static_cast<index_t>(logits.shape(d));
  // Parameters: one set for every row, or one per row where any argument is an array; the
  // per-row set is built here (a copy of rows parameter sets, a few bytes per row).
  params_buffer.assign(1, sampling_params{});
  fill_param(temperature, "temperature", rows,
             [](sampling_params& p, double v) { p.temperature = static_cast<float>(v); });
  fill_param(top_k, "top_k", rows,
             [](sampling_params& p, double v) { p.top_k = static_cast<index_t>(v); });
  fill_param(top_p, "top_p", rows,
             [](sampling_params& p, double v) { p.top_p = static_cast<float>(v); });
  fill_param(min_p, "min_p", rows,
             [](sampling_params& p, double v) { p.min_p = static_cast<float>(v); });
  fill_param(cfg_scale, "cfg_scale", rows,
             [](sampling_params& p, double v) { p.cfg_scale = static_cast<float>(v); });
  const row_view<const sampling_params> params{params_buffer.data(),
                                               static_cast<index_t>(params_buffer.size())};
  auto probs_rows = rows_view<float>(probs, "probs");
  const batch_view<float> out{static_cast<float*>(probs.data()), probs_rows.rows, probs_rows.cols,
                              probs_rows.row_stride};
  auto run = [&](auto element) {
    using T = decltype(element);
    const auto in = rows_view<T>(logits, "logits");
    const auto un = uncond.is_valid() ? rows_view<T>(uncond, "uncond") : batch_view<const T>{};
    record_pointer("logits", in.data);
    record_pointer("probs", out.data);
    nb::gil_scoped_release release;
    with_policy(threads,
                [&](const auto& policy) { logits_to_probs<T>(policy, in, un, params, out); });
  };
  if (has_dtype<float>(logits))
    run(float{});
  else if (logits.dtype() == bfloat16_dtype)
    run(bfloat16{});
  else if (logits.dtype() == half_dtype)
    run(half{});
  else
    type_error("specula: logits must have dtype float32, bfloat16 or float16 (got " +
               dtype_name(logits.dtype()) + ")");
}

}  // namespace

void register_transforms(nb::module_& m) {
  m.def("_logits_to_probs", &logits_to_probs_binding, nb::arg("logits"), nb::arg("uncond").none(),
        nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"), nb::arg("min_p"),
        nb::arg("cfg_scale"), nb::arg("probs"), nb::arg("threads"));
}

}  // namespace specula::python
