// specula._specula: argument handling shared by the bindings, the rule objects, and the module.

#include <Python.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace specula::python {

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

void type_error(const std::string& message) { throw nb::type_error(message.c_str()); }
void value_error(const std::string& message) { throw nb::value_error(message.c_str()); }

std::string dtype_name(nb::dlpack::dtype t) {
  using code = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<code>(t.code)) {
    case code::Int:
      base = "int";
      break;
    case code::UInt:
      base = "uint";
      break;
    case code::Float:
      base = "float";
      break;
    case code::Bfloat:
      base = "bfloat";
      break;
    case code::Complex:
      base = "complex";
      break;
    case code::Bool:
      return "bool";
    default:
      base = "dtype" + std::to_string(t.code) + "_";
  }
  return base + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

// ---------------------------------------------------------------------------------------------
// Array arguments
// ---------------------------------------------------------------------------------------------

namespace {

/// The torch objects the imports below use, looked up once, when the first torch.Tensor
/// arrives (torch is then imported); null until then, or when torch lacks one of them.
struct torch_api {
  PyTypeObject* tensor_type = nullptr;
  PyObject* to_dlpack = nullptr;  // torch._C._to_dlpack
  struct dtype_entry {
    PyObject* object;  // torch.float32, ...
    nb::dlpack::dtype code;
  };
  std::vector<dtype_entry> dtypes;
  PyObject* is_cpu = nullptr;  // interned attribute and method names
  PyObject* dtype = nullptr;
  PyObject* data_ptr = nullptr;
  PyObject* shape = nullptr;
  PyObject* stride = nullptr;
};

/// The torch API when `h` is exactly a torch.Tensor, else null.
const torch_api* torch_of(nb::handle h) {
  static torch_api api;
  if (api.tensor_type == nullptr) {
    if (std::strcmp(Py_TYPE(h.ptr())->tp_name, "Tensor") != 0) return nullptr;
    const nb::object torch = nb::steal(PyImport_GetModule(nb::str("torch").ptr()));
    if (!torch.is_valid()) {
      PyErr_Clear();
      return nullptr;
    }
    const nb::object type = nb::getattr(torch, "Tensor", nb::none());
    const nb::object c = nb::getattr(torch, "_C", nb::none());
    const nb::object fn = c.is_none() ? nb::none() : nb::getattr(c, "_to_dlpack", nb::none());
    if (!PyType_Check(type.ptr()) || fn.is_none()) return nullptr;
    const std::pair<const char*, nb::dlpack::dtype> dtypes[] = {
        {"float32", nb::dtype<float>()},
        {"float64", nb::dtype<double>()},
        {"float16", {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1}},
        {"bfloat16", {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1}},
        {"int32", nb::dtype<std::int32_t>()},
        {"int64", nb::dtype<std::int64_t>()}};
    for (const auto& [name, code] : dtypes) {
      const nb::object d = nb::getattr(torch, name, nb::none());
      if (!d.is_none()) api.dtypes.push_back({d.inc_ref().ptr(), code});  // kept for the process
    }
    api.is_cpu = PyUnicode_InternFromString("is_cpu");
    api.dtype = PyUnicode_InternFromString("dtype");
    api.data_ptr = PyUnicode_InternFromString("data_ptr");
    api.shape = PyUnicode_InternFromString("shape");
    api.stride = PyUnicode_InternFromString("stride");
    api.to_dlpack = fn.inc_ref().ptr();
    api.tensor_type = reinterpret_cast<PyTypeObject*>(type.inc_ref().ptr());
  }
  return Py_TYPE(h.ptr()) == api.tensor_type ? &api : nullptr;
}

/// A non-empty CPU torch.Tensor (exactly torch.Tensor) of one of the dtypes above as an ndarray
/// over its data, built from `data_ptr()`, `shape` and `stride()` and holding a reference to the
/// tensor: about 0.6 us per tensor, where a DLPack capsule from torch._C._to_dlpack costs about
/// 1.2 us before nanobind reads it (docs/PERFORMANCE.md). What it does not check is what the
/// capsule path does not check either: requires_grad (the verifiers only read such tensors) and
/// the negative bit (only views of complex tensors carry it). Otherwise (another device or
/// dtype, no storage, an empty tensor, any error) an invalid array: the caller then imports `h`
/// through the capsule or as any other object.
array torch_cpu_array(nb::handle h) {
  const torch_api* t = torch_of(h);
  if (t == nullptr) return {};
  PyObject* o = h.ptr();
  const auto fail = [] {
    PyErr_Clear();
    return array();
  };
  const nb::object cpu = nb::steal(PyObject_GetAttr(o, t->is_cpu));
  if (!cpu.is_valid()) return fail();
  if (cpu.ptr() != Py_True) return {};
  const nb::object dtype = nb::steal(PyObject_GetAttr(o, t->dtype));
  if (!dtype.is_valid()) return fail();
  const nb::dlpack::dtype* code = nullptr;
  for (const auto& e : t->dtypes)
    if (e.object == dtype.ptr()) code = &e.code;
  if (code == nullptr) return {};
  const nb::object shape = nb::steal(PyObject_GetAttr(o, t->shape));
  const nb::object stride = nb::steal(PyObject_CallMethodNoArgs(o, t->stride));
  const nb::object data = nb::steal(PyObject_CallMethodNoArgs(o, t->data_ptr));
  if (!shape.is_valid() || !stride.is_valid() || !data.is_valid()) return fail();
  if (PyTuple_Check(shape.ptr()) == 0 || PyTuple_Check(stride.ptr()) == 0) return {};
  constexpr Py_ssize_t max_ndim = 8;
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim > max_ndim || PyTuple_GET_SIZE(stride.ptr()) != ndim) return {};
  std::size_t dims[max_ndim];
  std::int64_t strides[max_ndim];
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    dims[d] = PyLong_AsSize_t(PyTuple_GET_ITEM(shape.ptr(), d));
    strides[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride.ptr(), d));
    if (PyErr_Occurred() != nullptr) return fail();
    if (dims[d] == 0) return {};
  }
  void* ptr = PyLong_AsVoidPtr(data.ptr());
  if (PyErr_Occurred() != nullptr) return fail();
  if (ptr == nullptr) return {};
  return array(ptr, static_cast<std::size_t>(ndim), dims, h, strides, *code, nb::device::cpu::value,
               0);
}

/// A DLPack capsule of `h` when it is a torch.Tensor (exactly; torch already imported), made by
/// torch._C._to_dlpack: the C function behind Tensor.__dlpack__, which in torch 1.13-2.x is a
/// Python method costing about 1 us per tensor before it calls it. The checks it skips do not
/// apply here: requires_grad (the verifiers only read such tensors: probabilities; outputs are
/// integer tensors, which cannot require gradients), the conjugate bit (complex dtypes are
/// refused) and sparse layouts (refused by _to_dlpack itself). Otherwise, or when the call
/// fails, an invalid object: the caller then imports `h` as any other object.
nb::object torch_capsule(nb::handle h) {
  const torch_api* t = torch_of(h);
  if (t == nullptr) return {};
  nb::object capsule = nb::steal(PyObject_CallOneArg(t->to_dlpack, h.ptr()));
  if (!capsule.is_valid()) PyErr_Clear();
  return capsule;
}

}  // namespace

namespace {

std::string device_of(const array& a) {
  if (a.device_type() == nb::device::cpu::value) return "cpu";
  return (a.device_type() == nb::device::cuda::value
              ? "cuda:"
              : "device " + std::to_string(a.device_type()) + ":") +
         std::to_string(a.device_id());
}

}  // namespace

void require_cpu(const array& a, const char* name) {
  if (!a.is_valid() || a.device_type() == nb::device::cpu::value) return;
#ifdef SPECULA_PYTHON_CUDA
  value_error(std::string("specula: ") + name + " is on " + device_of(a) +
              ", but this function runs on the CPU only (CUDA tensors are taken by "
              "chain_speculative_sampling, rejection_sample and greedy_chain): pass CPU arrays "
              "(tensor.cpu() copies)");
#else
  value_error(std::string("specula: ") + name + " is on " + device_of(a) +
              ", but this build of the specula package runs on the CPU only (it was built "
              "without CUDA: -Ccmake.define.SPECULA_PYTHON_CUDA=ON): pass CPU arrays "
              "(tensor.cpu() copies), or call specula::cuda from C++");
#endif
}

bool call_on_cuda(const named_array& target, std::initializer_list<named_array> others) {
#ifdef SPECULA_PYTHON_CUDA
  const array& t = *target.a;
  if (t.device_type() == nb::device::cuda::value) {
    for (const named_array& o : others)
      if (o.a->is_valid() &&
          (o.a->device_type() != t.device_type() || o.a->device_id() != t.device_id()))
        value_error(std::string("specula: ") + o.name + " is on " + device_of(*o.a) + ", but " +
                    target.name + " is on " + device_of(t) +
                    ": every array of a call must be on the same device");
    return true;
  }
#endif
  require_cpu(*target.a, target.name);
  for (const named_array& o : others) require_cpu(*o.a, o.name);
  return false;
}

namespace {

/// The text of a Python exception raised by `f` (cleared), or empty when it raises none.
template <class F>
std::string python_error_of(F&& f) {
  try {
    f();
  } catch (nb::python_error& e) {
    // The exception's type and text, without the traceback that what() carries.
    const nb::handle value = e.value();
    return std::string(nb::type_name(value.type()).c_str()) + ": " +
           nb::cast<std::string>(nb::str(value));
  }
  return {};
}

/// Raises the error of an array argument that could not be imported: TypeError or ValueError
/// naming it and saying why (non-native byte order, a read-only output, a meta tensor, the
/// exporter's own error), or TypeError for an object that is not an array at all.
[[noreturn]] void explain_import_failure(nb::handle h, const char* name, bool writable) {
  const std::string arg = std::string("specula: ") + name;
  const nb::object dtype = nb::getattr(h, "dtype", nb::none());
  // NumPy: byte order and writability.
  if (!dtype.is_none() && nb::hasattr(dtype, "isnative") && !nb::cast<bool>(dtype.attr("isnative")))
    type_error(arg + " has non-native byte order (dtype " +
               nb::cast<std::string>(nb::str(dtype.attr("str"))) +
               "): convert it with .astype(a.dtype.newbyteorder('='))");
  const nb::object flags = nb::getattr(h, "flags", nb::none());
  if (writable && !flags.is_none() && nb::hasattr(flags, "writeable") &&
      !nb::cast<bool>(flags.attr("writeable")))
    value_error(arg + " is read-only, but it is an output: pass a writable array");
  // torch: tensors without data.
  const nb::object device = nb::getattr(h, "device", nb::none());
  if (!device.is_none() && nb::hasattr(device, "type") &&
      nb::cast<std::string>(nb::str(device.attr("type"))) == "meta")
    value_error(arg + " is a meta tensor (it has no data): pass a tensor on the CPU" +
                std::string(
#ifdef SPECULA_PYTHON_CUDA
                    " or a CUDA device"
#else
                    ""
#endif
                    ));
  if (nb::hasattr(h, "__dlpack__")) {
    const std::string why = python_error_of([&] { (void)h.attr("__dlpack__")(); });
    type_error(
        arg + " could not be read over DLPack" +
        (why.empty() ? std::string(" (an unsupported dtype, layout or device)") : ": " + why));
  }
  type_error(arg +
             " must be a NumPy array or a PyTorch tensor (any object with __dlpack__ or the "
             "buffer protocol), not " +
             nb::type_name(h.type()).c_str());
}

}  // namespace

array import_array(nb::handle h, const char* name, bool writable, bool any_device) {
  array a = torch_cpu_array(h);
  if (a.is_valid()) return a;  // a CPU tensor: no device check needed
  bool ok = false;
  const nb::object capsule = torch_capsule(h);
  const nb::handle source = capsule.is_valid() ? nb::handle(capsule) : h;
  if (writable) {
    ok = nb::try_cast(source, a, /*convert=*/false);
  } else {
    nb::ndarray<nb::ro> ro;
    ok = nb::try_cast(source, ro, /*convert=*/false);
    if (ok) a = array(ro);
  }
  if (!ok) explain_import_failure(h, name, writable);
  if (!any_device) require_cpu(a, name);
  return a;
}

bool is_scalar(nb::handle h) {
  if (PyLong_Check(h.ptr()) != 0 || PyFloat_Check(h.ptr()) != 0) return true;
  if (!nb::hasattr(h, "shape")) return PyIndex_Check(h.ptr()) != 0;
  const nb::object shape = h.attr("shape");
  return PySequence_Check(shape.ptr()) != 0 && PySequence_Size(shape.ptr()) == 0;
}

array import_optional(nb::handle h, const char* name, bool writable, bool any_device) {
  if (h.is_none()) return {};
  return import_array(h, name, writable, any_device);
}

void require_ndim(const array& a, const char* name, std::size_t ndim, const char* shape) {
  if (a.ndim() != ndim)
    value_error(std::string("specula: ") + name + " must have shape " + shape + " (got " +
                std::to_string(a.ndim()) + " dimensions)");
}

void require_contiguous(const array& a, const char* name) {
  // An array without elements has no layout to respect (NumPy gives a (0, L) array strides
  // (0, 0)): an empty batch is a no-op, as the C++ entry points make it.
  for (std::size_t d = 0; d < a.ndim(); ++d)
    if (a.shape(d) == 0) return;
  std::int64_t expected = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    const auto n = static_cast<std::int64_t>(a.shape(d));
    if (n == 1) continue;
    if (a.stride(d) != expected)
      value_error(std::string("specula: ") + name +
                  " must be C-contiguous (use .contiguous() / np.ascontiguousarray, which "
                  "copies)");
    expected *= n;
  }
}

index_t element_count(const array& a) {
  index_t n = 1;
  for (std::size_t d = 0; d < a.ndim(); ++d) n *= static_cast<index_t>(a.shape(d));
  return n;
}

index_view index_array(const array& a, const char* name) {
  require_contiguous(a, name);
  if (a.ndim() != 1)
    value_error(std::string("specula: ") + name + " must be 1-D (got " + std::to_string(a.ndim()) +
                " dimensions)");
  const auto n = static_cast<index_t>(a.shape(0));
  if (has_dtype<std::int64_t>(a)) return {static_cast<const std::int64_t*>(a.data()), n};
  if (has_dtype<std::int32_t>(a)) return {static_cast<const std::int32_t*>(a.data()), n};
  type_error(std::string("specula: ") + name + " must have dtype int32 or int64 (got " +
             dtype_name(a.dtype()) + ")");
}

row_view<const token_t> token_array(const array& a, const char* name,
                                    std::vector<token_t>& buffer) {
  require_contiguous(a, name);
  const index_t n = element_count(a);
  if (has_dtype<std::int32_t>(a)) return {static_cast<const token_t*>(a.data()), n};
  if (has_dtype<std::int64_t>(a)) {
    const auto* src = static_cast<const std::int64_t*>(a.data());
    buffer.resize(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      const std::int64_t v = src[i];
      if (v < INT32_MIN || v > INT32_MAX) {
        // Token ids are 32-bit in C++: name the entry and its value here.
        std::string at = std::to_string(i);
        if (a.ndim() == 2 && a.shape(1) > 0)
          at = std::to_string(i / static_cast<index_t>(a.shape(1))) + ", " +
               std::to_string(i % static_cast<index_t>(a.shape(1)));
        value_error(std::string("specula: ") + name + "[" + at + "] = " + std::to_string(v) +
                    " is not a token id: ids must be in [0, vocab_size) (32-bit), or -1 for "
                    "padding");
      }
      buffer[static_cast<std::size_t>(i)] = static_cast<token_t>(v);
    }
    return {buffer.data(), n};
  }
  type_error(std::string("specula: ") + name + " must have dtype int32 or int64 (got " +
             dtype_name(a.dtype()) + ")");
}

namespace {

template <class T>
row_view<T> output_view(const array& a, const char* name, const char* expected, bool ok) {
  if (!ok)
    type_error(std::string("specula: ") + name + " must have dtype " + expected + " (got " +
               dtype_name(a.dtype()) + ")");
  require_contiguous(a, name);
  if (a.is_valid() && element_count(a) > 0 && a.data() == nullptr)
    value_error(std::string("specula: ") + name + " has no data");
  return {static_cast<T*>(a.data()), element_count(a)};
}

}  // namespace

row_view<std::int32_t> int32_output(const array& a, const char* name) {
  return output_view<std::int32_t>(a, name, "int32", has_dtype<std::int32_t>(a));
}

row_view<std::uint8_t> flag8_output(const array& a, const char* name) {
  if (!a.is_valid()) return {};
  return output_view<std::uint8_t>(a, name, "uint8 or bool",
                                   has_dtype<std::uint8_t>(a) || has_dtype<bool>(a));
}

row_view<std::uint32_t> flags_output(const array& a, const char* name) {
  if (!a.is_valid()) return {};
  return output_view<std::uint32_t>(a, name, "int32 or uint32",
                                    has_dtype<std::uint32_t>(a) || has_dtype<std::int32_t>(a));
}

row_view<index_t> int64_output(const array& a, const char* name) {
  if (!a.is_valid()) return {};
  return output_view<index_t>(a, name, "int64", has_dtype<std::int64_t>(a));
}

// ---------------------------------------------------------------------------------------------
// Pointers handed to C++
// ---------------------------------------------------------------------------------------------

namespace {

struct pointer_record {
  std::array<std::pair<const char*, const void*>, 16> entries{};
  std::size_t count = 0;
};

thread_local pointer_record last_call;

}  // namespace

void clear_pointers() { last_call.count = 0; }

void record_pointer(const char* name, const void* p) {
  if (last_call.count < last_call.entries.size()) last_call.entries[last_call.count++] = {name, p};
}

nb::dict last_pointers() {
  nb::dict d;
  for (std::size_t i = 0; i < last_call.count; ++i)
    d[last_call.entries[i].first] = reinterpret_cast<std::uintptr_t>(last_call.entries[i].second);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Random streams
// ---------------------------------------------------------------------------------------------

namespace {

/// A Python integer (or anything with __index__) in [0, max].
std::uint64_t scalar_of(nb::handle h, const char* name, std::uint64_t max) {
  if (PyIndex_Check(h.ptr()) == 0 || PyBool_Check(h.ptr()) != 0 || PyFloat_Check(h.ptr()) != 0)
    type_error(std::string("specula: ") + name +
               " must be an integer or a 1-D integer array with one entry per request, not " +
               nb::type_name(h.type()).c_str());
  nb::object index = nb::steal(PyNumber_Index(h.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred() != nullptr) throw nb::python_error();
  std::uint64_t u = 0;
  if (overflow == 0 && v >= 0) {
    u = static_cast<std::uint64_t>(v);
  } else if (overflow > 0) {
    u = PyLong_AsUnsignedLongLong(index.ptr());
    if (PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      value_error(std::string("specula: ") + name + " must be in [0, " + std::to_string(max) + "]");
    }
  } else {
    value_error(std::string("specula: ") + name + " must be in [0, " + std::to_string(max) +
                "] (got a negative value)");
  }
  if (u > max)
    value_error(std::string("specula: ") + name + " must be in [0, " + std::to_string(max) +
                "] (got " + std::to_string(u) + ")");
  return u;
}

/// Fills field `set(rng[b], value)` from a scalar or a per-request array; returns whether the
/// argument was a scalar.
template <class Set>
bool fill_stream_field(nb::handle h, const char* name, std::uint64_t max, index_t batch,
                       std::vector<request_rng>& rng, Set set) {
  if (is_scalar(h)) {
    const std::uint64_t v = scalar_of(h, name, max);
    for (auto& r : rng) set(r, v);
    return true;
  }
  if (PyList_Check(h.ptr()) != 0 || PyTuple_Check(h.ptr()) != 0) {  // a few Python integers
    const nb::sequence seq = nb::borrow<nb::sequence>(h);
    if (static_cast<index_t>(nb::len(seq)) != batch)
      value_error(std::string("specula: ") + name +
                  " must have one entry per request (B = " + std::to_string(batch) + ")");
    index_t b = 0;
    for (nb::handle item : seq) set(rng[static_cast<std::size_t>(b++)], scalar_of(item, name, max));
    return false;
  }
  const array a = import_array(h, name);
  require_contiguous(a, name);
  if (a.ndim() != 1 || static_cast<index_t>(a.shape(0)) != batch)
    value_error(std::string("specula: ") + name + " must be an integer or have shape (B,) = (" +
                std::to_string(batch) + ",)");
  auto check = [&](index_t b, std::uint64_t v, bool negative) {
    if (negative || v > max)
      value_error(std::string("specula: ") + name + "[" + std::to_string(b) + "] must be in [0, " +
                  std::to_string(max) + "]");
    set(rng[static_cast<std::size_t>(b)], v);
  };
  if (has_dtype<std::int64_t>(a)) {
    const auto* p = static_cast<const std::int64_t*>(a.data());
    for (index_t b = 0; b < batch; ++b) check(b, static_cast<std::uint64_t>(p[b]), p[b] < 0);
  } else if (has_dtype<std::uint64_t>(a)) {
    const auto* p = static_cast<const std::uint64_t*>(a.data());
    for (index_t b = 0; b < batch; ++b) check(b, p[b], false);
  } else if (has_dtype<std::int32_t>(a)) {
    const auto* p = static_cast<const std::int32_t*>(a.data());
    for (index_t b = 0; b < batch; ++b) check(b, static_cast<std::uint64_t>(p[b]), p[b] < 0);
  } else if (has_dtype<std::uint32_t>(a)) {
    const auto* p = static_cast<const std::uint32_t*>(a.data());
    for (index_t b = 0; b < batch; ++b) check(b, p[b], false);
  } else {
    type_error(std::string("specula: ") + name +
               " must have dtype int64, uint64, int32 or uint32 (got " + dtype_name(a.dtype()) +
               ")");
  }
  return false;
}

thread_local std::vector<request_rng> rng_buffer;

}  // namespace

std::vector<std::uint8_t> mask_of(nb::handle h, const char* name, index_t batch) {
  std::vector<std::uint8_t> mask;
  if (h.is_none()) return mask;
  const std::string arg = std::string("specula: ") + name;
  if (PyList_Check(h.ptr()) != 0 || PyTuple_Check(h.ptr()) != 0) {
    if (static_cast<index_t>(nb::len(h)) != batch)
      value_error(arg + " must have one entry per request (B = " + std::to_string(batch) +
                  "; got " + std::to_string(nb::len(h)) + ")");
    for (nb::handle item : nb::borrow<nb::sequence>(h)) {
      const int t = PyObject_IsTrue(item.ptr());
      if (t < 0) throw nb::python_error();
      mask.push_back(static_cast<std::uint8_t>(t));
    }
    return mask;
  }
  const array a = import_array(h, name);
  if (a.ndim() != 1 || static_cast<index_t>(a.shape(0)) != batch)
    value_error(arg + " must have shape (B,) = (" + std::to_string(batch) + ",)");
  require_contiguous(a, name);
  mask.resize(static_cast<std::size_t>(batch));
  auto fill = [&](const auto* p) {
    for (index_t b = 0; b < batch; ++b) mask[static_cast<std::size_t>(b)] = p[b] != 0 ? 1 : 0;
  };
  if (has_dtype<bool>(a) || has_dtype<std::uint8_t>(a))
    fill(static_cast<const std::uint8_t*>(a.data()));
  else if (has_dtype<std::int8_t>(a))
    fill(static_cast<const std::int8_t*>(a.data()));
  else if (has_dtype<std::int32_t>(a))
    fill(static_cast<const std::int32_t*>(a.data()));
  else if (has_dtype<std::int64_t>(a))
    fill(static_cast<const std::int64_t*>(a.data()));
  else
    type_error(arg + " must have dtype bool, uint8, int8, int32 or int64 (got " +
               dtype_name(a.dtype()) + ")");
  return mask;
}

row_view<const request_rng> make_rng(nb::handle seeds, nb::handle request_ids, nb::handle steps,
                                     index_t batch, const std::uint8_t* skip) {
  rng_buffer.assign(static_cast<std::size_t>(batch), request_rng{});
  const bool scalar_seed = fill_stream_field(seeds, "seeds", UINT64_MAX, batch, rng_buffer,
                                             [](request_rng& r, std::uint64_t v) { r.seed = v; });
  const bool scalar_id = fill_stream_field(
      request_ids, "request_ids", UINT32_MAX, batch, rng_buffer,
      [](request_rng& r, std::uint64_t v) { r.request_id = static_cast<std::uint32_t>(v); });
  fill_stream_field(
      steps, "steps", UINT32_MAX, batch, rng_buffer,
      [](request_rng& r, std::uint64_t v) { r.step = static_cast<std::uint32_t>(v); });
  index_t sampled_count = batch;
  if (skip != nullptr)
    for (index_t b = 0; b < batch; ++b) sampled_count -= skip[b] != 0 ? 1 : 0;
  if (sampled_count > 1 && scalar_seed && scalar_id)
    value_error(
        "specula: seeds and request_ids are both single integers for a batch of " +
        std::to_string(batch) +
        " requests, so every request would draw the same random numbers: pass one seed or one "
        "request id per request");
  const row_view<const request_rng> rng{rng_buffer.data(), batch};
  detail::shared_stream_pair shared;
  if (skip == nullptr) {
    shared = detail::find_shared_stream(rng);
  } else {  // the sampled requests only
    thread_local std::vector<request_rng> sampled;
    thread_local std::vector<index_t> index;
    sampled.clear();
    index.clear();
    for (index_t b = 0; b < batch; ++b)
      if (skip[b] == 0) {
        sampled.push_back(rng[b]);
        index.push_back(b);
      }
    shared = detail::find_shared_stream({sampled.data(), static_cast<index_t>(sampled.size())});
    if (shared.second >= 0)
      shared = {index[static_cast<std::size_t>(shared.first)],
                index[static_cast<std::size_t>(shared.second)]};
  }
  if (shared.second >= 0) {
    const std::string a = std::to_string(shared.first);
    const std::string b = std::to_string(shared.second);
    value_error("specula: requests " + a + " and " + b +
                " would draw the same random numbers: both have seed " +
                std::to_string(rng[shared.second].seed) + " and request id " +
                std::to_string(rng[shared.second].request_id) + " (" +
                (scalar_seed ? "seeds" : "seeds[" + a + "] = seeds[" + b + "]") + ", " +
                (scalar_id ? "request_ids" : "request_ids[" + a + "] = request_ids[" + b + "]") +
                "): give each request of a call its own (seed, request id) pair");
  }
  return rng;
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

std::vector<float>& wide_rows_buffer(int which) {
  thread_local std::vector<float> buffers[2];
  return buffers[which != 0 ? 1 : 0];
}

check_level parse_check(const std::string& check) {
  if (check == "reads") return check_level::reads;
  if (check == "full") return check_level::full;
  value_error("specula: check must be 'reads' or 'full' (got '" + check + "')");
}

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------

namespace {

resampling parse_resampling(const std::string& s) {
  if (s == "optimal") return resampling::optimal;
  if (s == "vanilla") return resampling::vanilla;
  if (s == "lantern") return resampling::lantern;
  value_error("specula: resampling must be 'optimal', 'vanilla' or 'lantern' (got '" + s + "')");
}

std::string number(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

const rule_holder exact_holder{};

}  // namespace

const rule_holder& rule_of(nb::handle h) {
  if (h.is_none()) return exact_holder;
  rule_holder* r = nullptr;
  if (!nb::try_cast(h, r, false) || r == nullptr)
    type_error(std::string("specula: rule must be a specula rule (specula.exact_rule(), "
                           "relaxed_rule(...), ...) or None, not ") +
               nb::type_name(h.type()).c_str());
  return *r;
}

std::vector<const rule_holder*> per_request_rules(nb::handle h, index_t batch,
                                                  std::vector<nb::object>& keep) {
  const nb::sequence seq = nb::borrow<nb::sequence>(h);
  const auto n = static_cast<index_t>(nb::len(seq));
  if (n != batch)
    value_error("specula: rule must be one rule, or a sequence of one rule per request (B = " +
                std::to_string(batch) + "; got " + std::to_string(n) + ")");
  std::vector<const rule_holder*> holders;
  holders.reserve(static_cast<std::size_t>(n));
  for (nb::handle item : seq) {
    keep.push_back(nb::borrow(item));
    holders.push_back(&rule_of(item));
    if (holders.back()->rule.index() != holders.front()->rule.index())
      value_error("specula: rule: the rules of a sequence must be of one kind (rule[0] is " +
                  holders.front()->description + ", rule[" + std::to_string(holders.size() - 1) +
                  "] is " + holders.back()->description + ")");
  }
  return holders;
}

void register_rules(nb::module_& m) {
  nb::class_<schedule_holder>(m, "Schedule", "A relaxation schedule: omega at each draft position.")
      .def(
          "omega", [](const schedule_holder& s, index_t i) { return s.schedule.omega(i); },
          nb::arg("position"), "omega at draft position i >= 1")
      .def("__repr__", [](const schedule_holder& s) { return s.description; });

  m.def(
      "uniform_schedule",
      [](double delta) {
        return schedule_holder{relaxation_schedule::make_uniform(delta), nullptr,
                               "uniform_schedule(" + number(delta) + ")"};
      },
      nb::arg("delta"));
  m.def(
      "exponential_schedule",
      [](double delta, double nu, index_t length) {
        return schedule_holder{relaxation_schedule::make_exponential(delta, nu, length), nullptr,
                               "exponential_schedule(" + number(delta) + ", " + number(nu) + ", " +
                                   std::to_string(length) + ")"};
      },
      nb::arg("delta"), nb::arg("nu"), nb::arg("length"));
  m.def(
      "linear_schedule",
      [](double delta, double ell, index_t length) {
        return schedule_holder{relaxation_schedule::make_linear(delta, ell, length), nullptr,
                               "linear_schedule(" + number(delta) + ", " + number(ell) + ", " +
                                   std::to_string(length) + ")"};
      },
      nb::arg("delta"), nb::arg("ell"), nb::arg("length"));
  m.def(
      "custom_schedule",
      [](const std::vector<double>& values) {
        auto owned = std::make_shared<const std::vector<double>>(values);
        return schedule_holder{
            relaxation_schedule::make_custom(owned->data(), static_cast<index_t>(owned->size())),
            owned, "custom_schedule(<" + std::to_string(values.size()) + " values>)"};
      },
      nb::arg("values"));

  nb::class_<table_holder>(m, "NeighbourTable",
                           "Each token's k nearest other tokens (LANTERN / LANTERN++).")
      .def_prop_ro("vocab_size", [](const table_holder& t) { return t.table->vocab(); })
      .def_prop_ro("k", [](const table_holder& t) { return t.table->k(); })
      .def("neighbours", [](const table_holder& t, index_t token) {
        if (token < 0 || token >= t.table->vocab())
          value_error("specula: token must be in [0, " + std::to_string(t.table->vocab()) + ")");
        return t.table->neighbours(token);
      });
  m.def(
      "neighbour_table",
      [](nb::handle embeddings, index_t k, const std::string& metric) {
        const array a = import_array(embeddings, "embeddings");
        require_ndim(a, "embeddings", 2, "(V, d)");
        require_dtype<float>(a, "embeddings", "float32");
        neighbour_metric mt = neighbour_metric::l2;
        if (metric == "cosine")
          mt = neighbour_metric::cosine;
        else if (metric != "l2")
          value_error("specula: metric must be 'l2' or 'cosine' (got '" + metric + "')");
        const auto rows = rows_view<float>(a, "embeddings");
        nb::gil_scoped_release release;
        return table_holder{std::make_shared<const neighbour_table>(rows, k, mt)};
      },
      nb::arg("embeddings"), nb::arg("k"), nb::arg("metric") = "l2",
      "The k nearest other tokens of every row of a (V, d) float32 embedding matrix.");
  m.def(
      "neighbour_table_from_ids",
      [](nb::handle ids) {
        const array a = import_array(ids, "ids");
        require_ndim(a, "ids", 2, "(V, k)");
        std::vector<token_t> buffer;
        const auto v = token_array(a, "ids", buffer);
        std::vector<token_t> copy(v.begin(), v.end());
        return table_holder{std::make_shared<const neighbour_table>(
            std::move(copy), static_cast<index_t>(a.shape(0)), static_cast<index_t>(a.shape(1)))};
      },
      nb::arg("ids"), "A table from precomputed (V, k) neighbour ids, nearest first.");

  nb::class_<rule_holder>(m, "Rule", "An acceptance rule for the verifiers.")
      .def("__repr__", [](const rule_holder& r) { return r.description; });
  m.def("exact_rule", [] { return rule_holder{}; });
  m.def(
      "relaxed_rule",
      [](double omega, const std::string& resample) {
        require_parameter(detail::is_finite(omega) && omega > 0.0, "omega", omega,
                          "must be finite and > 0");
        const resampling r = parse_resampling(resample);
        if (r == resampling::lantern)
          value_error("specula: resampling='lantern' is only for lantern_rule");
        return rule_holder{relaxed_rule{omega, r}, nullptr, nullptr,
                           "relaxed_rule(" + number(omega) + ", '" + resample + "')"};
      },
      nb::arg("omega"), nb::arg("resampling") = "optimal");
  m.def(
      "scheduled_rule",
      [](const schedule_holder& s, const std::string& resample) {
        const resampling r = parse_resampling(resample);
        if (r == resampling::lantern)
          value_error("specula: resampling='lantern' is only for lantern_rule");
        return rule_holder{scheduled_relaxed_rule{s.schedule, r}, s.values, nullptr,
                           "scheduled_rule(" + s.description + ", '" + resample + "')"};
      },
      nb::arg("schedule"), nb::arg("resampling") = "optimal");
  m.def(
      "lantern_rule",
      [](const table_holder& t, double lam, const std::string& resample, const std::string& mode) {
        const resampling r = parse_resampling(resample);
        lantern_rule rule;
        if (mode == "relative")
          rule = lantern_rule::make_relative(*t.table, lam, r);
        else if (mode == "absolute")
          rule = lantern_rule::make_absolute(*t.table, lam, r);
        else
          value_error("specula: mode must be 'relative' (LANTERN++) or 'absolute' (LANTERN)");
        return rule_holder{rule, nullptr, t.table,
                           "lantern_rule(<table V=" + std::to_string(t.table->vocab()) +
                               " k=" + std::to_string(t.table->k()) + ">, " + number(lam) + ", '" +
                               resample + "', '" + mode + "')"};
      },
      nb::arg("table"), nb::arg("lam"), nb::arg("resampling") = "optimal",
      nb::arg("mode") = "relative");
  m.def(
      "typical_rule",
      [](double epsilon, double alpha, const std::string& resample) {
        const resampling r = parse_resampling(resample);
        return rule_holder{
            typical_rule::make(epsilon, alpha, r), nullptr, nullptr,
            "typical_rule(" + number(epsilon) + ", " + number(alpha) + ", '" + resample + "')"};
      },
      nb::arg("epsilon") = 0.09, nb::arg("alpha") = 0.3, nb::arg("resampling") = "optimal");
}

}  // namespace specula::python

NB_MODULE(_specula, m) {
  namespace sp = specula::python;
  namespace nb = nanobind;
  m.doc() = "specula's C++ verifiers over DLPack (see docs/python.md)";
  m.attr("__version__") = SPECULA_VERSION_STRING;
#ifdef SPECULA_PYTHON_CUDA
  m.attr("_has_cuda") = true;
#else
  m.attr("_has_cuda") = false;
#endif
  nb::exception<specula::invalid_input>(m, "InvalidInput", PyExc_ValueError);
  m.def("_last_pointers", &sp::last_pointers,
        "Data pointers the last call in this thread handed to C++, by argument (for tests).");
  sp::register_rules(m);
  sp::register_chain(m);
  sp::register_tree(m);
  sp::register_transforms(m);
}
