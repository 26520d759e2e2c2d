#pragma once

// Shared pieces of the Python bindings (specula._specula): array arguments taken over DLPack
// or the buffer protocol without conversion (so never copied behind the caller's back), their
// checks with messages naming the argument, per-request random streams, acceptance rules and
// host policies. Every verification itself is a call of the public C++ entry points.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "specula/verify.hpp"

namespace specula::python {

namespace nb = nanobind;

/// An array argument of any dtype and device, imported without conversion.
using array = nb::ndarray<>;

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

[[noreturn]] void type_error(const std::string& message);
[[noreturn]] void value_error(const std::string& message);

/// "float32", "int64", "bfloat16", ... for messages.
std::string dtype_name(nb::dlpack::dtype t);

// ---------------------------------------------------------------------------------------------
// Array arguments
// ---------------------------------------------------------------------------------------------

/// Imports `h` (a NumPy array, a PyTorch tensor or any DLPack / buffer-protocol object) without
/// conversion, on the CPU. TypeError for other objects, ValueError for another device. Inputs
/// are imported read-only (one unversioned __dlpack__() call, which every producer answers);
/// `writable` outputs ask for a writable export.
/// `any_device`: arrays on other devices are imported too (the chain verifiers, which check the
/// devices of a call with call_on_cuda).
array import_array(nb::handle h, const char* name, bool writable = false, bool any_device = false);

/// As import_array, or an invalid array for None (an optional argument left out).
array import_optional(nb::handle h, const char* name, bool writable = false,
                      bool any_device = false);

/// ValueError naming the argument unless the array is in host memory.
void require_cpu(const array& a, const char* name);

/// An array argument and its name, for call_on_cuda.
struct named_array {
  const array* a;
  const char* name;
};

/// Whether a call runs on a CUDA device: `target` (imported with any_device) is a CUDA array and
/// every valid one of `others` is on the same device — ValueError naming the first that is not.
/// A CPU target: every array must be in host memory (require_cpu). Builds without
/// SPECULA_PYTHON_CUDA refuse CUDA arrays (require_cpu).
bool call_on_cuda(const named_array& target, std::initializer_list<named_array> others);

/// Whether `h` is a single number: a Python int or float, or a 0-d array or NumPy scalar.
[[nodiscard]] bool is_scalar(nb::handle h);

/// Whether the array has dtype T (uint8 also matches bool, int32 also matches uint32 for flags).
template <class T>
[[nodiscard]] bool has_dtype(const array& a) {
  return a.dtype() == nb::dtype<T>();
}

/// TypeError naming the argument unless the array has dtype T.
template <class T>
void require_dtype(const array& a, const char* name, const char* expected) {
  if (!has_dtype<T>(a))
    type_error(std::string("specula: ") + name + " must have dtype " + expected + " (got " +
               dtype_name(a.dtype()) + ")");
}

/// ValueError unless the array has `ndim` dimensions.
void require_ndim(const array& a, const char* name, std::size_t ndim, const char* shape);

/// ValueError unless the array is C-contiguous (dimensions of extent 1 ignored).
void require_contiguous(const array& a, const char* name);

/// Elements of a contiguous array.
[[nodiscard]] index_t element_count(const array& a);

/// A contiguous array of T viewed as one row (any number of dimensions).
template <class T>
[[nodiscard]] row_view<T> flat_view(const array& a, const char* name, const char* expected) {
  require_dtype<std::remove_const_t<T>>(a, name, expected);
  require_contiguous(a, name);
  return {static_cast<T*>(a.data()), element_count(a)};
}

/// Rows of a probability or logit array whose last dimension is the vocabulary: every leading
/// dimension is flattened into rows, which must be evenly spaced (row stride >= V, last stride
/// 1); a sliced array such as logits[:, :V] is read in place.
template <class T>
[[nodiscard]] batch_view<const T> rows_view(const array& a, const char* name) {
  if (a.ndim() < 1)
    value_error(std::string("specula: ") + name + " must have at least 1 dimension");
  const std::size_t last = a.ndim() - 1;
  const auto cols = static_cast<index_t>(a.shape(last));
  index_t rows = 1;
  for (std::size_t d = 0; d < last; ++d) rows *= static_cast<index_t>(a.shape(d));
  if (rows == 0 || cols == 0) return {static_cast<const T*>(a.data()), rows, cols, cols};
  if (cols > 1 && a.stride(last) != 1)
    value_error(std::string("specula: ") + name +
                " must be contiguous along its last dimension (the vocabulary)");
  // Leading dimensions must form one evenly spaced sequence of rows.
  index_t row_stride = cols;
  bool found = false;
  index_t expected = 0;
  for (std::size_t d = last; d-- > 0;) {
    const auto n = static_cast<index_t>(a.shape(d));
    if (n == 1) continue;
    const auto s = static_cast<index_t>(a.stride(d));
    if (!found) {
      row_stride = s;
      found = true;
    } else if (s != expected) {
      value_error(std::string("specula: ") + name +
                  " is not contiguous: its rows must be evenly spaced (use .contiguous() / "
                  "np.ascontiguousarray, which copies)");
    }
    expected = s * n;
  }
  if (rows > 1 && row_stride < cols)
    value_error(std::string("specula: ") + name + " is not contiguous: its row stride (" +
                std::to_string(row_stride) + ") is smaller than its row length (" +
                std::to_string(cols) + ")");
  return {static_cast<const T*>(a.data()), rows, cols, row_stride};
}

/// An int64 or int32 contiguous 1-D array as an index_view.
[[nodiscard]] index_view index_array(const array& a, const char* name);

/// Token ids: int32 in place; int64 copied into `buffer` (a copy of the ids, documented).
[[nodiscard]] row_view<const token_t> token_array(const array& a, const char* name,
                                                  std::vector<token_t>& buffer);

/// Writable outputs.
[[nodiscard]] row_view<std::int32_t> int32_output(const array& a, const char* name);
[[nodiscard]] row_view<std::uint8_t> flag8_output(const array& a, const char* name);
[[nodiscard]] row_view<std::uint32_t> flags_output(const array& a, const char* name);
[[nodiscard]] row_view<index_t> int64_output(const array& a, const char* name);

// ---------------------------------------------------------------------------------------------
// Pointers handed to C++ (for the zero-copy tests: specula._specula._last_pointers())
// ---------------------------------------------------------------------------------------------

void clear_pointers();
void record_pointer(const char* name, const void* p);
nb::dict last_pointers();

// ---------------------------------------------------------------------------------------------
// Random streams
// ---------------------------------------------------------------------------------------------

/// One request_rng per request from `seeds`, `request_ids` and `steps`, each a Python integer
/// (the same for every request) or a 1-D integer array of B entries. Reuses a thread-local
/// buffer. ValueError when B > 1 and seeds and request_ids are both scalars (every request
/// would draw the same numbers).
/// `skip`: null, or B flags; requests flagged 1 (verified greedily: they draw nothing) are left
/// out of the shared-stream check.
row_view<const request_rng> make_rng(nb::handle seeds, nb::handle request_ids, nb::handle steps,
                                     index_t batch, const std::uint8_t* skip = nullptr);

/// A per-request boolean mask (None: empty): a (B,) bool, uint8 or integer array, or a list of
/// B truth values, as 0 / 1. TypeError / ValueError naming the argument otherwise.
std::vector<std::uint8_t> mask_of(nb::handle h, const char* name, index_t batch);

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------

/// A relaxation schedule with the storage of its custom values.
struct schedule_holder {
  relaxation_schedule schedule;
  std::shared_ptr<const std::vector<double>> values;
  std::string description;
};

/// A neighbour table shared by the LANTERN rules made from it.
struct table_holder {
  std::shared_ptr<const neighbour_table> table;
};

/// An acceptance rule passed from Python, with what it refers to kept alive.
struct rule_holder {
  std::variant<exact_rule, relaxed_rule, scheduled_relaxed_rule, lantern_rule, typical_rule> rule;
  std::shared_ptr<const std::vector<double>> values;
  std::shared_ptr<const neighbour_table> table;
  std::string description = "exact_rule()";
};

/// The rule of a `rule` argument: None is the exact rule.
const rule_holder& rule_of(nb::handle h);

/// Rules the tree and K-candidate verifiers accept (scalar acceptance rules, or one per
/// request).
template <class R>
inline constexpr bool scalar_rule = acceptance_rule<typename detail::unwrap_per_request<R>::type>;

/// The holders of a `rule` argument that is a sequence of B rules (one per request; None is the
/// exact rule), all of one kind; TypeError / ValueError naming `rule` otherwise. The Python
/// objects are kept in `keep` for the duration of the call.
std::vector<const rule_holder*> per_request_rules(nb::handle h, index_t batch,
                                                  std::vector<nb::object>& keep);

/// Calls f(rule) with the rule of a `rule` argument: None (the exact rule), one Rule (every
/// request), or a sequence of B Rules of one kind (per_request: request b uses rules[b]).
template <class F>
void visit_rule(nb::handle h, index_t batch, F&& f) {
  if (PyList_Check(h.ptr()) == 0 && PyTuple_Check(h.ptr()) == 0) {
    std::visit(f, rule_of(h).rule);
    return;
  }
  std::vector<nb::object> keep;
  const std::vector<const rule_holder*> holders = per_request_rules(h, batch, keep);
  if (holders.empty()) {
    f(per_request<exact_rule>{});
    return;
  }
  std::visit(
      [&](const auto& first) {
        using R = std::remove_cvref_t<decltype(first)>;
        std::vector<R> rules;
        rules.reserve(holders.size());
        for (const rule_holder* r : holders) rules.push_back(std::get<R>(r->rule));
        f(per_request<R>{row_view<const R>{rules.data(), static_cast<index_t>(rules.size())}});
      },
      holders.front()->rule);
}

/// visit_rule for the verifiers that take scalar acceptance rules only (trees, K candidates):
/// a row-aware rule (LANTERN++, typical acceptance) raises ValueError naming `verifier`.
template <class F>
void visit_scalar_rule(nb::handle h, index_t batch, const char* verifier, F&& f) {
  visit_rule(h, batch, [&](const auto& rule) {
    if constexpr (!scalar_rule<std::remove_cvref_t<decltype(rule)>>)
      value_error(std::string("specula: ") + verifier +
                  " takes exact, relaxed or scheduled rules (row-aware rules such as LANTERN++ "
                  "and typical acceptance work with chains only)");
    else
      f(rule);
  });
}

// ---------------------------------------------------------------------------------------------
// Options and policies
// ---------------------------------------------------------------------------------------------

check_level parse_check(const std::string& check);

/// Runs f(policy): host::seq for threads == 1, host::par (all threads) for 0, else
/// host::par.with_threads(threads).
template <class F>
decltype(auto) with_policy(int threads, F&& f) {
  if (threads < 0) value_error("specula: threads must be >= 0 (0: all hardware threads)");
  if (threads == 1) return f(host::seq);
  return f(host::par.with_threads(static_cast<unsigned>(threads)));
}

/// Whether an array holds float16 or bfloat16 values.
[[nodiscard]] inline bool is_16bit_float(const array& a) {
  const nb::dlpack::dtype t = a.dtype();
  return t.bits == 16 && t.lanes == 1 &&
         (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) ||
          t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat));
}

/// Runs f(float{}) or f(double{}) by the dtype of a probability array: float32 (and float16 /
/// bfloat16, read through prob_rows as float32) or float64.
template <class F>
decltype(auto) with_prob_type(const array& a, const char* name, F&& f) {
  if (has_dtype<float>(a) || is_16bit_float(a)) return f(float{});
  if (has_dtype<double>(a)) return f(double{});
  type_error(std::string("specula: ") + name +
             " must have dtype float32, float64, float16 or bfloat16 (got " +
             dtype_name(a.dtype()) + ")");
}

/// Rows of a probability array (see rows_view) as T: rows of dtype T are read in place; for
/// T = float, float16 and bfloat16 rows are widened exactly (every such value is a float) into
/// `buffer`, dense rows: a copy, the only one of probability rows (docs/python.md).
template <class T>
[[nodiscard]] batch_view<const T> prob_rows(const array& a, const char* name,
                                            std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    if (is_16bit_float(a)) {
      const bool bf16 = a.dtype().code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat);
      const batch_view<const std::uint16_t> raw = rows_view<std::uint16_t>(a, name);
      buffer.resize(static_cast<std::size_t>(raw.rows * raw.cols));
      for (index_t r = 0; r < raw.rows; ++r) {
        const std::uint16_t* src = raw.data + r * raw.row_stride;
        float* dst = buffer.data() + r * raw.cols;
        if (bf16)
          for (index_t i = 0; i < raw.cols; ++i) dst[i] = to_float(bfloat16{src[i]});
        else
          for (index_t i = 0; i < raw.cols; ++i) dst[i] = to_float(half{src[i]});
      }
      return {buffer.data(), raw.rows, raw.cols, raw.cols};
    }
  }
  return rows_view<T>(a, name);
}

/// Thread-local buffers of prob_rows: 0 for target rows, 1 for draft rows.
std::vector<float>& wide_rows_buffer(int which);

// Registration of each part of the module.
void register_rules(nb::module_& m);
void register_chain(nb::module_& m);
void register_tree(nb::module_& m);
void register_transforms(nb::module_& m);

}  // namespace specula::python
