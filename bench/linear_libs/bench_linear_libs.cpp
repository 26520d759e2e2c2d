// The example backend's linear layers against libraries, on the shipped models' shapes: the
// products of one forward pass (per layer: stacked query/key/value, output projection, stacked
// MLP inputs, MLP output; then the vocabulary projection) for m = 1..512 input rows (the nodes of
// a pass), y = x · Wᵀ with W as nn.Linear stores it ([out, in] row-major), fp32, one thread.
//
// linear/<library>/<model>/m:<m>
//   <library>: specula (gemm.hpp's packed micro-kernels, weights packed once), blis (bli_sgemm;
//   its "sup" kernels handle skinny products), libxsmm (JIT kernels over Wᵀ stored once, in
//   tiles of 64 output columns), onednn (matmul primitives with weights reordered once into the
//   primitive's layout), eigen (Map'ed matrices, X * Wᵀ), openblas (cblas_sgemm, loaded at run
//   time so its symbols do not clash with BLIS's).
// Each library is compiled in only when CMake found it (bench/linear_libs/CMakeLists.txt);
// every weight preparation happens before timing. Counters: GFLOPs, bytes (fp32 weights once),
// stream_GBps / frac_of_stream (bench/stream_baseline.hpp).
//
// OpenBLAS reads OPENBLAS_CORETYPE when it is loaded and then uses that core's kernels instead
// of detecting the CPU. This benchmark removes the variable before loading OpenBLAS (the
// variable's value and the core OpenBLAS chose are printed in the context) unless run with
// SPECULA_KEEP_OPENBLAS_CORETYPE=1.

#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <specula_example/kernels.hpp>

#include "../stream_baseline.hpp"

#if defined(SPECULA_HAVE_BLIS)
#include <blis.h>
#endif
#if defined(SPECULA_HAVE_XSMM)
#include <libxsmm.h>
#endif
#if defined(SPECULA_HAVE_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#endif
#if defined(SPECULA_HAVE_EIGEN)
#include <Eigen/Core>
#endif

using specula::index_t;
namespace ex = specula::example;

namespace {

struct shape {
  index_t out, in, count;  // count: how many times the pass multiplies by a matrix of this shape
};

struct model_shape {
  const char* name;
  std::vector<shape> shapes;
};

/// The shipped models' configurations (examples/models/*.md): d_model, layers, heads, KV heads,
/// d_ff, vocabulary.
model_shape model(const char* name, index_t d, index_t layers, index_t heads, index_t kv_heads,
                  index_t d_ff, index_t vocab) {
  const index_t kv = kv_heads * (d / heads);
  return {name,
          {{d + 2 * kv, d, layers},
           {d, d, layers},
           {2 * d_ff, d, layers},
           {d, d_ff, layers},
           {vocab, d, 1}}};
}

const std::vector<model_shape>& models() {
  static const std::vector<model_shape> all{
      model("text-target", 256, 4, 8, 2, 640, 256), model("text-draft", 64, 2, 4, 2, 192, 256),
      model("image-ar", 128, 4, 4, 2, 384, 137), model("text-diffusion", 192, 4, 6, 2, 512, 257)};
  return all;
}

/// One product of the pass: random weights, an input of m rows, an output.
struct product {
  shape s;
  std::vector<float> w, x, y;
};

std::vector<product> make_products(const model_shape& ms, index_t m) {
  std::mt19937_64 g(7);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<product> out;
  for (const shape& s : ms.shapes) {
    product p{s, std::vector<float>(static_cast<std::size_t>(s.out * s.in)),
              std::vector<float>(static_cast<std::size_t>(m * s.in)),
              std::vector<float>(static_cast<std::size_t>(m * s.out))};
    for (auto& v : p.w) v = d(g);
    for (auto& v : p.x) v = d(g);
    out.push_back(std::move(p));
  }
  return out;
}

/// A library's way to run a product, prepared once per (product, m) before timing.
using runner = std::function<void()>;
using prepare_fn = std::function<runner(product&, index_t m)>;

void bm_linear(benchmark::State& state, const model_shape& ms, const prepare_fn& prepare) {
  const auto m = static_cast<index_t>(state.range(0));
  auto products = make_products(ms, m);
  std::vector<runner> runs;
  double flops = 0.0, bytes = 0.0;
  for (product& p : products) {
    runs.push_back(prepare(p, m));
    flops += 2.0 * static_cast<double>(p.s.count * m * p.s.out * p.s.in);
    bytes += 4.0 * static_cast<double>(p.s.count * p.s.out * p.s.in);
  }
  specula::bench::run_against_stream(state, bytes, [&] {
    for (std::size_t i = 0; i < products.size(); ++i)
      for (index_t c = 0; c < products[i].s.count; ++c) runs[i]();
    benchmark::ClobberMemory();
  });
  state.counters["GFLOPs"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

// --- the libraries ---------------------------------------------------------------------------

prepare_fn specula_kernel() {
  return [](product& p, index_t m) -> runner {
    auto w = std::make_shared<ex::detail::linear_weights>(
        ex::matmul_kernel::builtin, p.s.in, std::initializer_list<std::span<const float>>{p.w});
    const ex::detail::kernel_context kc{ex::matmul_kernel::builtin, ex::best_cpu_isa(), 1};
    return [w, kc, &p, m] { ex::detail::linear(kc, p.x.data(), m, p.s.in, *w, p.y.data()); };
  };
}

#if defined(SPECULA_HAVE_BLIS)
prepare_fn blis() {
  return [](product& p, index_t m) -> runner {
    return [&p, m] {
      float one = 1.0f, zero = 0.0f;
      bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_TRANSPOSE, m, p.s.out, p.s.in, &one, p.x.data(), p.s.in, 1,
                p.w.data(), p.s.in, 1, &zero, p.y.data(), p.s.out, 1);
    };
  };
}
#endif

#if defined(SPECULA_HAVE_XSMM)
prepare_fn xsmm() {
  return [](product& p, index_t m) -> runner {
    // libxsmm is column-major: yᵀ (out x m) = W (out x in) · xᵀ (in x m). W as a column-major
    // matrix is Wᵀ stored row-major (transposed once here); xᵀ and yᵀ are x and y as they are.
    auto wt = std::make_shared<std::vector<float>>(p.w.size());
    for (index_t o = 0; o < p.s.out; ++o)
      for (index_t i = 0; i < p.s.in; ++i)
        (*wt)[static_cast<std::size_t>(i * p.s.out + o)] =
            p.w[static_cast<std::size_t>(o * p.s.in + i)];
    const libxsmm_blasint lda = p.s.out, ldb = p.s.in, ldc = p.s.out;
    const float alpha = 1.0f, beta = 0.0f;
    const int flags = LIBXSMM_GEMM_FLAG_NONE;
    const index_t tm = 64, tn = 64;  // output columns x rows per kernel call
    struct call {
      libxsmm_smmfunction f;
      index_t o, r;
    };
    auto calls = std::make_shared<std::vector<call>>();
    for (index_t o = 0; o < p.s.out; o += tm)
      for (index_t r = 0; r < m; r += tn) {
        const libxsmm_smmfunction f = libxsmm_smmdispatch(
            static_cast<libxsmm_blasint>(std::min(tm, p.s.out - o)),
            static_cast<libxsmm_blasint>(std::min(tn, m - r)), static_cast<libxsmm_blasint>(p.s.in),
            &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
        if (f == nullptr) throw std::runtime_error("libxsmm: no kernel for this shape");
        calls->push_back({f, o, r});
      }
    return [wt, calls, &p] {
      for (const call& c : *calls)
        c.f(wt->data() + c.o, p.x.data() + c.r * p.s.in, p.y.data() + c.r * p.s.out + c.o);
    };
  };
}
#endif

#if defined(SPECULA_HAVE_DNNL)
prepare_fn onednn() {
  return [](product& p, index_t m) -> runner {
    static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    static dnnl::stream stream(engine);
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc src({m, p.s.in}, dt::f32, tag::ab),
        dst({m, p.s.out}, dt::f32, tag::ab), w_plain({p.s.in, p.s.out}, dt::f32, tag::ba),
        w_any({p.s.in, p.s.out}, dt::f32, tag::any);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, w_any, dst), engine);  // 2.x API
    auto prim = std::make_shared<dnnl::matmul>(pd);
    auto weights = std::make_shared<dnnl::memory>(pd.weights_desc(), engine);
    dnnl::memory plain(w_plain, engine, p.w.data());
    dnnl::reorder(plain, *weights).execute(stream, plain, *weights);
    stream.wait();
    auto src_mem = std::make_shared<dnnl::memory>(src, engine, p.x.data());
    auto dst_mem = std::make_shared<dnnl::memory>(dst, engine, p.y.data());
    return [prim, weights, src_mem, dst_mem] {
      prim->execute(
          stream,
          {{DNNL_ARG_SRC, *src_mem}, {DNNL_ARG_WEIGHTS, *weights}, {DNNL_ARG_DST, *dst_mem}});
      stream.wait();
    };
  };
}
#endif

#if defined(SPECULA_HAVE_EIGEN)
prepare_fn eigen() {
  return [](product& p, index_t m) -> runner {
    using rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    return [&p, m] {
      const Eigen::Map<const rm> x(p.x.data(), m, p.s.in), w(p.w.data(), p.s.out, p.s.in);
      Eigen::Map<rm> y(p.y.data(), m, p.s.out);
      y.noalias() = x * w.transpose();
    };
  };
}
#endif

#if defined(SPECULA_OPENBLAS_LIBRARY)
using cblas_sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int,
                                const float*, int, float, float*, int);

struct openblas_handle {
  cblas_sgemm_fn sgemm = nullptr;
  std::string coretype_env, corename;
};

const openblas_handle& openblas() {
  static const openblas_handle h = [] {
    openblas_handle o;
    if (const char* v = std::getenv("OPENBLAS_CORETYPE")) o.coretype_env = v;
    const char* keep = std::getenv("SPECULA_KEEP_OPENBLAS_CORETYPE");
    if (keep == nullptr || std::string(keep) != "1") unsetenv("OPENBLAS_CORETYPE");
    void* lib = dlopen(SPECULA_OPENBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return o;
    o.sgemm = reinterpret_cast<cblas_sgemm_fn>(dlsym(lib, "cblas_sgemm"));
    using set_threads_fn = void (*)(int);
    if (auto f = reinterpret_cast<set_threads_fn>(dlsym(lib, "openblas_set_num_threads"))) f(1);
    using name_fn = char* (*)();
    if (auto f = reinterpret_cast<name_fn>(dlsym(lib, "openblas_get_corename"))) o.corename = f();
    return o;
  }();
  return h;
}

prepare_fn openblas_kernel() {
  return [](product& p, index_t m) -> runner {
    const cblas_sgemm_fn f = openblas().sgemm;
    // CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112.
    return [f, &p, m] {
      f(101, 111, 112, static_cast<int>(m), static_cast<int>(p.s.out), static_cast<int>(p.s.in),
        1.0f, p.x.data(), static_cast<int>(p.s.in), p.w.data(), static_cast<int>(p.s.in), 0.0f,
        p.y.data(), static_cast<int>(p.s.out));
    };
  };
}
#endif

void register_all() {
  std::vector<std::pair<std::string, prepare_fn>> libs{{"specula", specula_kernel()}};
#if defined(SPECULA_HAVE_BLIS)
  bli_thread_set_num_threads(1);
  libs.emplace_back("blis", blis());
#endif
#if defined(SPECULA_HAVE_XSMM)
  libxsmm_init();
  libs.emplace_back("libxsmm", xsmm());
#endif
#if defined(SPECULA_HAVE_DNNL)
  libs.emplace_back("onednn", onednn());
#endif
#if defined(SPECULA_HAVE_EIGEN)
  Eigen::setNbThreads(1);
  libs.emplace_back("eigen", eigen());
#endif
#if defined(SPECULA_OPENBLAS_LIBRARY)
  if (openblas().sgemm != nullptr) libs.emplace_back("openblas", openblas_kernel());
  benchmark::AddCustomContext("OPENBLAS_CORETYPE (environment)", openblas().coretype_env.empty()
                                                                     ? "(unset)"
                                                                     : openblas().coretype_env);
  benchmark::AddCustomContext("openblas core", openblas().corename);
#endif
  benchmark::AddCustomContext("specula isa", ex::to_string(ex::best_cpu_isa()));
  for (const model_shape& ms : models())
    for (const auto& [name, prepare] : libs) {
      const model_shape* msp = &ms;
      const prepare_fn prep = prepare;
      benchmark::RegisterBenchmark(("linear/" + name + "/" + ms.name).c_str(),
                                   [msp, prep](benchmark::State& s) { bm_linear(s, *msp, prep); })
          ->ArgName("m")
          ->Args({1})
          ->Args({2})
          ->Args({4})
          ->Args({8})
          ->Args({16})
          ->Args({32})
          ->Args({64})
          ->Args({512})
          ->Unit(benchmark::kMicrosecond);
    }
}

const int registered = (register_all(), 0);

}  // namespace

BENCHMARK_MAIN();
