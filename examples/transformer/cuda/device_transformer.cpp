// The device forward pass (device_transformer.hpp): host side. Weights, caches and scratch live
// on the GPU; each evaluation uploads one packed buffer (tokens, positions, the row -> block
// map, the block table, the masks) and enqueues per layer: RMSNorm, the stacked q/k/v GEMM, RoPE
// (+ the blocks' keys/values into their caches), attention, the output projection GEMM (added
// to the residual by beta = 1), RMSNorm, the stacked w1/w3 GEMM, SwiGLU and the w2 GEMM (added
// to the residual); then the final RMSNorm and the vocabulary GEMM.
//
// Weights are fp32: the shipped models hold at most 2.8 M parameters (11 MB in fp32, inside an
// H100's 50 MB L2), so a pass is bound by launch latency, not by weight bytes, and fp32 keeps
// the device logits within float rounding of the host backend's (which computes in fp32 from
// the same bf16-stored values), so that greedy decoding on both agrees token for token. The GEMMs
// are the small tiled kernel of device_kernels.cu, not cuBLAS: at these sizes (d_model <= 256,
// a few hundred rows) a pass is launch-bound either way, and libcublasLt (541 MB in CUDA 13)
// could not travel with the device-check bundle (64 MiB) to a GPU machine without the toolkit.

#include "specula_example/device_transformer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "device_kernels.hpp"
#include "specula/core/error.hpp"
#include "specula/tree/builders.hpp"

namespace specula::example {
namespace device_detail {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(e)}, what,
                    cudaGetErrorString(e));
}

template <class T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

}  // namespace

struct layer {
  float *attention_norm, *wqkv, *wo, *ffn_norm, *w13, *w2;
};

struct context {
  transformer_config c;
  cudaStream_t stream = nullptr;
  std::vector<void*> owned;  // weights
  float *embeddings = nullptr, *norm = nullptr, *output = nullptr, *cos = nullptr, *sin = nullptr;
  std::vector<layer> layers;
  // Scratch, grown on demand: `rows` rows.
  index_t rows = 0;
  float *x = nullptr, *xn = nullptr, *qkv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *att = nullptr, *gate_up = nullptr, *logits = nullptr;
  std::vector<std::byte> upload;
  std::byte* dev_upload = nullptr;
  std::size_t upload_capacity = 0;
  device_traffic traffic;
  specula::detail::row_top* tops = nullptr;  // row summaries (evaluate_*_tops)
  std::size_t tops_capacity = 0;
  // CUDA graphs of a pass's launch sequence, one per shape (rows, blocks, key bucket): every
  // pointer a launch reads is fixed by the shape while the scratch and upload buffers stay,
  // so the graphs are dropped whenever either is reallocated.
  bool graphs_enabled = false;
  std::map<std::array<std::int64_t, 3>, cudaGraphExec_t> graphs;
  index_t vocab_limit = 0;  // 0: the whole vocabulary (set_vocab_limit)

  void drop_graphs() noexcept {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
  }

  float* put(const std::vector<float>& host) {
    float* d = device_alloc<float>(host.size());
    owned.push_back(d);
    check(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy");
    return d;
  }

  void free_scratch() noexcept {
    for (float* p : {x, xn, qkv, q, k, v, att, gate_up, logits}) cudaFree(p);
    x = xn = qkv = q = k = v = att = gate_up = logits = nullptr;
    rows = 0;
  }

  void reserve_rows(index_t n) {
    if (n <= rows) return;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    drop_graphs();
    free_scratch();
    const index_t r = std::max<index_t>(n, 2 * rows);
    const auto sz = [&](index_t cols) { return static_cast<std::size_t>(r * cols); };
    x = device_alloc<float>(sz(c.d_model));
    xn = device_alloc<float>(sz(c.d_model));
    qkv = device_alloc<float>(sz(c.q_dim() + 2 * c.kv_dim()));
    q = device_alloc<float>(sz(c.q_dim()));
    k = device_alloc<float>(sz(c.kv_dim()));
    v = device_alloc<float>(sz(c.kv_dim()));
    att = device_alloc<float>(sz(c.q_dim()));
    gate_up = device_alloc<float>(sz(2 * c.d_ff));
    logits = device_alloc<float>(sz(c.vocab_size));
    rows = r;
  }

  /// y[rows x out] (row stride ldy) = beta * y + x[rows x in] (row stride ldx) * W^T, with W
  /// [out x in] row-major (the file's layout).
  void linear(const float* x_in, index_t ldx, index_t n_rows, index_t in, const float* w,
              index_t out, float* y, index_t ldy, float beta) const {
    check(device_detail::linear(stream, x_in, static_cast<int>(ldx), static_cast<int>(n_rows),
                                static_cast<int>(in), w, static_cast<int>(out), y,
                                static_cast<int>(ldy), beta),
          "linear");
  }

  ~context() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    drop_graphs();
    free_scratch();
    cudaFree(tops);
    for (void* p : owned) cudaFree(p);
    cudaFree(dev_upload);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

}  // namespace device_detail

using device_detail::check;

bool cuda_device_available() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

// --- device_slot_storage ---------------------------------------------------------------------

device_slot_storage::device_slot_storage(device_slot_storage&& o) noexcept
    : ctx_(o.ctx_),
      data_(o.data_),
      capacity_(o.capacity_),
      from_(o.from_),
      from_capacity_(o.from_capacity_) {
  o.data_ = nullptr;
  o.from_ = nullptr;
  o.capacity_ = o.from_capacity_ = 0;
}

device_slot_storage& device_slot_storage::operator=(device_slot_storage&& o) noexcept {
  if (this != &o) {
    release();
    ctx_ = o.ctx_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    from_ = o.from_;
    from_capacity_ = o.from_capacity_;
    o.data_ = nullptr;
    o.from_ = nullptr;
    o.capacity_ = o.from_capacity_ = 0;
  }
  return *this;
}

device_slot_storage::~device_slot_storage() { release(); }

void device_slot_storage::release() noexcept {
  cudaFree(data_);  // synchronises the device: the model's pending work on the rows is done
  cudaFree(from_);
  data_ = nullptr;
  from_ = nullptr;
  capacity_ = from_capacity_ = 0;
}

void device_slot_storage::reserve(index_t slots, index_t keep) {
  if (ctx_ == nullptr)
    throw_if_failed({status::invalid_parameter, -1, -1, 0.0}, "cache",
                    "a device cache is bound to a model by its first evaluation");
  if (slots <= capacity_) return;
  const transformer_config& c = ctx_->c;
  const index_t cap = std::max<index_t>({slots, 2 * capacity_, 64});
  const auto row = static_cast<std::size_t>(c.kv_dim());
  float* grown = device_detail::device_alloc<float>(static_cast<std::size_t>(2 * c.n_layers) *
                                                    static_cast<std::size_t>(cap) * row);
  if (data_ != nullptr && keep > 0)
    check(cudaMemcpy2DAsync(grown, static_cast<std::size_t>(cap) * row * sizeof(float), data_,
                            static_cast<std::size_t>(capacity_) * row * sizeof(float),
                            static_cast<std::size_t>(keep) * row * sizeof(float),
                            static_cast<std::size_t>(2 * c.n_layers), cudaMemcpyDeviceToDevice,
                            ctx_->stream),
          "cudaMemcpy2DAsync");
  check(cudaStreamSynchronize(ctx_->stream), "cudaStreamSynchronize");
  cudaFree(data_);
  data_ = grown;
  capacity_ = cap;
}

void device_slot_storage::gather(index_t at, std::span<const index_t> from) {
  if (from.empty()) return;
  if (ctx_ == nullptr || data_ == nullptr)
    throw_if_failed({status::invalid_parameter, -1, -1, 0.0}, "cache", "not bound to a model");
  const auto n = static_cast<index_t>(from.size());
  if (n > from_capacity_) {
    check(cudaStreamSynchronize(ctx_->stream), "cudaStreamSynchronize");
    cudaFree(from_);
    from_capacity_ = std::max<index_t>(n, 64);
    from_ = device_detail::device_alloc<std::int32_t>(static_cast<std::size_t>(from_capacity_));
  }
  std::vector<std::int32_t> f(from.size());
  for (std::size_t k = 0; k < from.size(); ++k) {
    if (from[k] < at + static_cast<index_t>(k) || from[k] >= capacity_)
      throw_if_failed(
          {status::invalid_parameter, static_cast<index_t>(k), -1, static_cast<double>(from[k])},
          "from", "a gather source below its destination or beyond the capacity");
    f[k] = static_cast<std::int32_t>(from[k]);
  }
  // Pageable source: staged before cudaMemcpyAsync returns, so `f` may go out of scope.
  check(cudaMemcpyAsync(from_, f.data(), f.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                        ctx_->stream),
        "cudaMemcpyAsync");
  ctx_->traffic.bytes_to_device += f.size() * sizeof(std::int32_t);
  const transformer_config& c = ctx_->c;
  check(device_detail::gather_rows(ctx_->stream, data_, static_cast<int>(2 * c.n_layers),
                                   static_cast<int>(capacity_), static_cast<int>(c.kv_dim()),
                                   static_cast<int>(at), from_, static_cast<int>(n)),
        "gather_rows");
}

std::vector<float> device_slot_storage::download(index_t layer, bool values, index_t slots) const {
  if (ctx_ == nullptr || slots > capacity_ || layer < 0 || layer >= ctx_->c.n_layers)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(slots)}, "slots",
                    "outside the bound cache");
  const auto row = static_cast<std::size_t>(ctx_->c.kv_dim());
  std::vector<float> out(static_cast<std::size_t>(slots) * row);
  const std::size_t plane = static_cast<std::size_t>(2 * layer + (values ? 1 : 0));
  check(cudaMemcpyAsync(out.data(), data_ + plane * static_cast<std::size_t>(capacity_) * row,
                        out.size() * sizeof(float), cudaMemcpyDeviceToHost, ctx_->stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(ctx_->stream), "cudaStreamSynchronize");
  return out;
}

// --- device_transformer ----------------------------------------------------------------------

device_transformer::device_transformer(const transformer_weights& w)
    : ctx_(std::make_unique<device_detail::context>()) {
  if (!cuda_device_available())
    throw_if_failed({status::invalid_parameter, -1, -1, 0.0}, "device", "no CUDA device");
  auto& x = *ctx_;
  x.c = w.config;
  const transformer_config& c = x.c;
  check(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto stack = [](std::initializer_list<const std::vector<float>*> parts) {
    std::vector<float> s;
    for (const auto* p : parts) s.insert(s.end(), p->begin(), p->end());
    return s;
  };
  x.embeddings = x.put(w.tok_embeddings);
  for (const layer_weights& l : w.layers)
    x.layers.push_back({x.put(l.attention_norm), x.put(stack({&l.wq, &l.wk, &l.wv})), x.put(l.wo),
                        x.put(l.ffn_norm), x.put(stack({&l.w1, &l.w3})), x.put(l.w2)});
  x.norm = x.put(w.norm);
  x.output = x.put(w.output);
  std::vector<float> cs, sn;
  detail::rope_tables(c, cs, sn);
  x.cos = x.put(cs);
  x.sin = x.put(sn);
  const char* graphs = std::getenv("SPECULA_CUDA_GRAPHS");
  x.graphs_enabled = graphs != nullptr && std::string(graphs) == "1";
}

device_transformer::device_transformer(device_transformer&&) noexcept = default;
device_transformer& device_transformer::operator=(device_transformer&&) noexcept = default;
device_transformer::~device_transformer() = default;

const transformer_config& device_transformer::config() const noexcept { return ctx_->c; }
void* device_transformer::stream() const noexcept { return ctx_->stream; }
void device_transformer::synchronize() const {
  check(cudaStreamSynchronize(ctx_->stream), "cudaStreamSynchronize");
}
const device_traffic& device_transformer::traffic() const noexcept { return ctx_->traffic; }
void device_transformer::set_graphs(bool on) {
  if (!on) {
    synchronize();
    ctx_->drop_graphs();
  }
  ctx_->graphs_enabled = on;
}
bool device_transformer::graphs() const noexcept { return ctx_->graphs_enabled; }
void device_transformer::set_vocab_limit(index_t limit) {
  require_parameter(limit >= 1 && limit <= vocab_size(), "limit", static_cast<double>(limit),
                    "must be in [1, vocab_size]");
  synchronize();
  ctx_->drop_graphs();  // the captured passes launch the mask with the old limit, or none
  ctx_->vocab_limit = limit;
}
index_t device_transformer::vocab_limit() const noexcept {
  return ctx_->vocab_limit > 0 ? ctx_->vocab_limit : vocab_size();
}

namespace {

template <class T>
std::size_t append(std::vector<std::byte>& buf, std::span<const T> items) {
  const std::size_t at = (buf.size() + 15) / 16 * 16;
  buf.resize(at + items.size_bytes());
  if (!items.empty()) std::memcpy(buf.data() + at, items.data(), items.size_bytes());
  return at;
}

}  // namespace

const float* device_transformer::run(std::span<const device_node_block> blocks, bool stash) const {
  auto& x = *ctx_;
  const transformer_config& c = x.c;
  using device_detail::attn_block;
  std::vector<std::int32_t> tokens, positions, row_block;
  std::vector<attn_block> table;
  std::vector<std::uint64_t> masks;
  index_t max_keys = 1;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const device_node_block& blk = blocks[b];
    const auto index = static_cast<index_t>(b);
    if (blk.cache == nullptr)
      throw_if_failed({status::invalid_parameter, index, -1, 0.0}, "blocks", "cache is null");
    // Read-only blocks (a dual cache's window passes) may see a bidirectional model's cached
    // context; a block that becomes pending nodes may not.
    detail::check_block(c, blk.tokens, blk.positions, blk.mask, stash ? blk.cache->size() : 0,
                        index);
    device_slot_storage& st = blk.cache->storage();
    if (st.ctx_ != nullptr && st.ctx_ != ctx_.get())
      throw_if_failed({status::invalid_parameter, index, -1, 0.0}, "blocks.cache",
                      "the cache belongs to another device model");
    if (stash) {
      for (std::size_t j = 0; j < b; ++j)
        if (blocks[j].cache == blk.cache)
          throw_if_failed({status::invalid_parameter, index, -1, static_cast<double>(j)},
                          "blocks.cache", "the same cache receives two blocks");
      st.ctx_ = ctx_.get();
      blk.cache->begin_pending(blk.positions, blk.mask);
    }
    const auto n = static_cast<index_t>(blk.tokens.size());
    const index_t ctx = blk.cache->size();
    if (ctx > 0 && st.data_ == nullptr)
      throw_if_failed({status::invalid_parameter, index, -1, 0.0}, "blocks.cache",
                      "committed context without device rows");
    table.push_back({st.data_, static_cast<std::int32_t>(tokens.size()),
                     static_cast<std::int32_t>(n), static_cast<std::int32_t>(ctx),
                     static_cast<std::int32_t>(st.capacity_),
                     static_cast<std::int32_t>((n + 63) / 64),
                     static_cast<std::int32_t>(masks.size()), stash ? 1 : 0, 0});
    max_keys = std::max(max_keys, ctx + n);
    masks.insert(masks.end(), blk.mask.begin(), blk.mask.end());
    for (index_t i = 0; i < n; ++i) {
      tokens.push_back(blk.tokens[static_cast<std::size_t>(i)]);
      positions.push_back(static_cast<std::int32_t>(blk.positions[static_cast<std::size_t>(i)]));
      row_block.push_back(static_cast<std::int32_t>(b));
    }
  }
  const auto R = static_cast<index_t>(tokens.size());
  ++x.traffic.evaluations;
  if (R == 0) return nullptr;
  x.reserve_rows(R);

  x.upload.clear();
  const std::size_t at_tokens = append<std::int32_t>(x.upload, tokens);
  const std::size_t at_positions = append<std::int32_t>(x.upload, positions);
  const std::size_t at_rows = append<std::int32_t>(x.upload, row_block);
  const std::size_t at_table = append<attn_block>(x.upload, table);
  const std::size_t at_masks = append<std::uint64_t>(x.upload, masks);
  if (x.upload.size() > x.upload_capacity) {
    check(cudaStreamSynchronize(x.stream), "cudaStreamSynchronize");
    x.drop_graphs();
    cudaFree(x.dev_upload);
    x.upload_capacity = std::max(x.upload.size(), 2 * x.upload_capacity);
    x.dev_upload = device_detail::device_alloc<std::byte>(x.upload_capacity);
  }
  check(cudaMemcpyAsync(x.dev_upload, x.upload.data(), x.upload.size(), cudaMemcpyHostToDevice,
                        x.stream),
        "cudaMemcpyAsync");
  x.traffic.bytes_to_device += x.upload.size();
  const auto* d_tokens = reinterpret_cast<const std::int32_t*>(x.dev_upload + at_tokens);
  const auto* d_positions = reinterpret_cast<const std::int32_t*>(x.dev_upload + at_positions);
  const auto* d_rows = reinterpret_cast<const std::int32_t*>(x.dev_upload + at_rows);
  const auto* d_table = reinterpret_cast<const attn_block*>(x.dev_upload + at_table);
  const auto* d_masks = reinterpret_cast<const std::uint64_t*>(x.dev_upload + at_masks);

  const device_detail::shape s{
      static_cast<std::int32_t>(c.d_model),    static_cast<std::int32_t>(c.n_heads),
      static_cast<std::int32_t>(c.n_kv_heads), static_cast<std::int32_t>(c.head_dim()),
      static_cast<std::int32_t>(c.d_ff),       static_cast<std::int32_t>(c.vocab_size)};
  const index_t d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.d_ff;
  const int rows = static_cast<int>(R);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim()));
  // The attention kernel's shared memory holds max_keys scores: a bucket of 256 keys (the
  // launch does not change while the context grows within it; the kernel reads each block's
  // own key count), or the exact count near the kernel's limit.
  const index_t bucket = (max_keys + 255) / 256 * 256;
  const int keys = static_cast<int>(bucket <= 11'000 ? bucket : max_keys);
  const auto enqueue = [&] {
    check(device_detail::embed(x.stream, d_tokens, x.embeddings, x.x, rows, static_cast<int>(d)),
          "embed");
    for (index_t l = 0; l < c.n_layers; ++l) {
      const device_detail::layer& w = x.layers[static_cast<std::size_t>(l)];
      check(device_detail::rms_norm(x.stream, x.x, w.attention_norm, c.norm_eps, x.xn, rows,
                                    static_cast<int>(d)),
            "rms_norm");
      x.linear(x.xn, d, R, d, w.wqkv, qd + 2 * kvd, x.qkv, qd + 2 * kvd, 0.0f);
      check(device_detail::rope_scatter(x.stream, s, x.qkv, d_positions, d_rows, d_table, x.cos,
                                        x.sin, x.q, x.k, x.v, rows, static_cast<int>(l)),
            "rope_scatter");
      check(device_detail::attention(x.stream, s, x.q, x.k, x.v, d_rows, d_table, d_masks, x.att,
                                     rows, static_cast<int>(l), scale, keys),
            "attention");
      x.linear(x.att, qd, R, qd, w.wo, d, x.x, d, 1.0f);
      check(device_detail::rms_norm(x.stream, x.x, w.ffn_norm, c.norm_eps, x.xn, rows,
                                    static_cast<int>(d)),
            "rms_norm");
      x.linear(x.xn, d, R, d, w.w13, 2 * ff, x.gate_up, 2 * ff, 0.0f);
      check(device_detail::swiglu(x.stream, x.gate_up, rows, static_cast<int>(ff)), "swiglu");
      x.linear(x.gate_up, 2 * ff, R, ff, w.w2, d, x.x, d, 1.0f);
    }
    check(
        device_detail::rms_norm(x.stream, x.x, x.norm, c.norm_eps, x.xn, rows, static_cast<int>(d)),
        "rms_norm");
    x.linear(x.xn, d, R, d, x.output, c.vocab_size, x.logits, c.vocab_size, 0.0f);
    if (x.vocab_limit > 0 && x.vocab_limit < c.vocab_size)
      check(device_detail::vocab_limit(x.stream, x.logits, rows, static_cast<int>(c.vocab_size),
                                       static_cast<int>(x.vocab_limit)),
            "vocab_limit");
  };
  if (!x.graphs_enabled) {
    enqueue();
    return x.logits;
  }
  // Every pointer the launches read is fixed by (rows, blocks) within the current buffers (the
  // upload's layout follows from them), every launch parameter by (rows, key bucket).
  const std::array<std::int64_t, 3> key{R, static_cast<std::int64_t>(blocks.size()), keys};
  auto it = x.graphs.find(key);
  if (it == x.graphs.end()) {
    if (x.graphs.size() >= 64) {  // shapes that do not repeat (prefills): launched directly
      enqueue();
      return x.logits;
    }
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(x.stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    try {
      enqueue();
    } catch (...) {
      cudaStreamEndCapture(x.stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(x.stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(e, "cudaGraphInstantiate");
    it = x.graphs.emplace(key, exec).first;
  }
  check(cudaGraphLaunch(it->second, x.stream), "cudaGraphLaunch");
  return x.logits;
}

namespace {

/// Copies `rows` device logit rows to the host view's rows [at, at + rows).
void to_host(device_detail::context& x, const float* rows_dev, index_t rows, batch_view<float> out,
             index_t at) {
  if (rows == 0) return;
  const auto V = static_cast<std::size_t>(x.c.vocab_size);
  check(cudaMemcpy2DAsync(out.data + at * out.row_stride,
                          static_cast<std::size_t>(out.row_stride) * sizeof(float), rows_dev,
                          V * sizeof(float), V * sizeof(float), static_cast<std::size_t>(rows),
                          cudaMemcpyDeviceToHost, x.stream),
        "cudaMemcpy2DAsync");
  x.traffic.bytes_to_host += static_cast<std::uint64_t>(rows) * V * sizeof(float);
}

index_t total_rows(std::span<const device_node_block> blocks) {
  index_t n = 0;
  for (const auto& b : blocks) n += static_cast<index_t>(b.tokens.size());
  return n;
}

void check_logits(const transformer_config& c, batch_view<float> logits, index_t rows) {
  if (logits.rows != rows || logits.cols != c.vocab_size)
    throw_if_failed(
        {status::length_mismatch, -1, -1, static_cast<double>(logits.rows)}, "logits",
        ("needs " + std::to_string(rows) + " rows of " + std::to_string(c.vocab_size) + " columns")
            .c_str());
}

}  // namespace

void device_transformer::evaluate(std::span<const device_node_block> blocks,
                                  batch_view<float> logits) const {
  const index_t R = total_rows(blocks);
  if (!logits.empty()) check_logits(config(), logits, R);
  const float* out = run(blocks, true);
  if (!logits.empty() && out != nullptr) to_host(*ctx_, out, R, logits, 0);
  synchronize();
}

const float* device_transformer::evaluate_device(std::span<const device_node_block> blocks) const {
  return run(blocks, true);
}

namespace {

/// A token tree's block below `cache` (positions cache.size() + depth, the ancestor mask).
struct tree_block_data {
  std::vector<index_t> positions;
  std::vector<std::uint64_t> mask;
  device_node_block block;
  tree_block_data(device_kv_cache& cache, const token_tree& tree)
      : positions(static_cast<std::size_t>(tree.size())),
        mask(static_cast<std::size_t>(tree.size() * tree.mask_words())) {
    for (index_t i = 0; i < tree.size(); ++i)
      positions[static_cast<std::size_t>(i)] = cache.size() + tree.depth(i);
    tree.attention_mask(mask);
    block = {&cache, tree.tokens(), positions, mask};
  }
};

}  // namespace

void device_transformer::evaluate_tree(device_kv_cache& cache, const token_tree& tree,
                                       batch_view<float> logits) const {
  const tree_block_data b(cache, tree);
  evaluate(std::span<const device_node_block>(&b.block, 1), logits);
}

const float* device_transformer::evaluate_tree_device(device_kv_cache& cache,
                                                      const token_tree& tree) const {
  const tree_block_data b(cache, tree);
  return evaluate_device(std::span<const device_node_block>(&b.block, 1));
}

void device_transformer::prefill(device_kv_cache& cache, std::span<const token_t> tokens) const {
  const token_tree chain = trees::chain(tokens);
  evaluate_tree(cache, chain, {});
  cache.commit_all();
}

namespace {

std::vector<std::uint64_t> mask_of(index_t n, bool causal) {
  const index_t words = (n + 63) / 64;
  std::vector<std::uint64_t> m(static_cast<std::size_t>(n * words), 0);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n && (!causal || j <= i); ++j)
      m[static_cast<std::size_t>(i * words + j / 64)] |= std::uint64_t{1} << (j % 64);
  return m;
}

}  // namespace

/// Where evaluate_sequences / evaluate_cached put their rows: copied into a host view, or
/// summarised (row_top) on the device into a device array that `finish` copies back.
struct device_transformer::row_sink {
  batch_view<float> logits;                  // host rows (empty: summaries)
  std::span<specula::detail::row_top> tops;  // host summaries
  void put(device_detail::context& x, const float* rows_dev, index_t rows, index_t at) const {
    if (rows == 0) return;
    if (!logits.empty() || tops.empty()) {
      to_host(x, rows_dev, rows, logits, at);
      return;
    }
    check(device_detail::row_tops(x.stream, rows_dev, static_cast<int>(rows),
                                  static_cast<int>(x.c.vocab_size), x.tops + at),
          "row_tops");
  }
  /// Before the first put: room for the summaries on the device.
  void begin(device_detail::context& x) const {
    if (tops.empty() || tops.size() <= x.tops_capacity) return;
    check(cudaStreamSynchronize(x.stream), "cudaStreamSynchronize");
    cudaFree(x.tops);
    x.tops = device_detail::device_alloc<specula::detail::row_top>(tops.size());
    x.tops_capacity = tops.size();
  }
  /// After the last put: the summaries to the host; waits for the stream.
  void finish(device_detail::context& x) const {
    if (logits.empty() && !tops.empty()) {
      check(
          cudaMemcpyAsync(tops.data(), x.tops, tops.size_bytes(), cudaMemcpyDeviceToHost, x.stream),
          "cudaMemcpyAsync");
      x.traffic.bytes_to_host += tops.size_bytes();
    }
    check(cudaStreamSynchronize(x.stream), "cudaStreamSynchronize");
  }
};

void device_transformer::evaluate_tree_tops(device_kv_cache& cache, const token_tree& tree,
                                            std::span<specula::detail::row_top> tops) const {
  check_logits(config(),
               batch_view<float>(nullptr, static_cast<index_t>(tops.size()), vocab_size()),
               tree.size());
  const tree_block_data b(cache, tree);
  const row_sink sink{{}, tops};
  sink.begin(*ctx_);
  const float* out = run(std::span<const device_node_block>(&b.block, 1), true);
  sink.put(*ctx_, out, tree.size(), 0);
  sink.finish(*ctx_);
}

void device_transformer::evaluate_sequences(std::span<const token_t> tokens, index_t length,
                                            batch_view<float> logits) const {
  const transformer_config& c = config();
  detail::check_sequences(c, tokens, length);
  check_logits(c, logits, static_cast<index_t>(tokens.size()));
  row_sink sink{logits, {}};
  sequences_to(tokens, length, sink);
}

void device_transformer::evaluate_sequences_tops(std::span<const token_t> tokens, index_t length,
                                                 std::span<specula::detail::row_top> tops) const {
  const transformer_config& c = config();
  detail::check_sequences(c, tokens, length);
  check_logits(c, batch_view<float>(nullptr, static_cast<index_t>(tops.size()), c.vocab_size),
               static_cast<index_t>(tokens.size()));
  row_sink sink{{}, tops};
  sequences_to(tokens, length, sink);
}

void device_transformer::sequences_to(std::span<const token_t> tokens, index_t length,
                                      row_sink& sink) const {
  const transformer_config& c = config();
  const auto count = static_cast<index_t>(tokens.size()) / length;
  std::vector<index_t> positions(static_cast<std::size_t>(length));
  for (index_t i = 0; i < length; ++i) positions[static_cast<std::size_t>(i)] = i;
  const auto mask = mask_of(length, c.causal);
  device_kv_cache none;  // read by no one: no committed context, nothing stashed
  std::vector<device_node_block> blocks;
  for (index_t s = 0; s < count; ++s)
    blocks.push_back(
        {&none,
         tokens.subspan(static_cast<std::size_t>(s * length), static_cast<std::size_t>(length)),
         positions, mask});
  sink.begin(*ctx_);
  const float* out = run(blocks, false);
  sink.put(*ctx_, out, count * length, 0);
  sink.finish(*ctx_);
}

void device_transformer::evaluate_cached(std::span<const dual_cache_pass<device_dual_cache>> passes,
                                         batch_view<float> logits) const {
  detail::check_cached_passes(config(), passes, logits);
  row_sink sink{logits, {}};
  cached_to(passes, sink);
}

void device_transformer::evaluate_cached_tops(
    std::span<const dual_cache_pass<device_dual_cache>> passes,
    std::span<specula::detail::row_top> tops) const {
  const transformer_config& c = config();
  detail::check_cached_passes(
      c, passes, batch_view<float>(nullptr, static_cast<index_t>(tops.size()), c.vocab_size));
  row_sink sink{{}, tops};
  cached_to(passes, sink);
}

void device_transformer::cached_to(std::span<const dual_cache_pass<device_dual_cache>> passes,
                                   row_sink& sink) const {
  const transformer_config& c = config();
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
  index_t max_len = 0;
  for (const auto& p : passes) max_len = std::max(max_len, p.length);
  std::vector<index_t> positions(sz(max_len));
  for (index_t i = 0; i < max_len; ++i) positions[sz(i)] = i;
  std::vector<std::vector<std::uint64_t>> masks(sz(max_len + 1));
  const auto visible = [&](index_t n) -> std::span<const std::uint64_t> {
    if (masks[sz(n)].empty()) masks[sz(n)] = mask_of(n, false);
    return masks[sz(n)];
  };
  // Each pass's first output row.
  std::vector<index_t> first(passes.size());
  for (std::size_t i = 0, row = 0; i < passes.size(); row += sz(passes[i].rows()), ++i)
    first[i] = static_cast<index_t>(row);
  sink.begin(*ctx_);

  // 1. Refreshes: node 0's whole sequence (stashed in the cache), then the rows outside the
  // window become the cache's committed context.
  std::vector<device_node_block> blocks;
  std::vector<std::size_t> owner;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    const auto& p = passes[i];
    if (!p.refresh) continue;
    p.cache->outside_.clear();
    blocks.push_back({&p.cache->outside_, p.tokens.first(sz(p.length)),
                      std::span(positions).first(sz(p.length)), visible(p.length)});
    owner.push_back(i);
  }
  if (!blocks.empty()) {
    const float* out = run(blocks, true);
    index_t row = 0;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const auto& p = passes[owner[b]];
      sink.put(*ctx_, out + row * c.vocab_size, p.length, first[owner[b]]);
      row += p.length;
      device_dual_cache& cache = *p.cache;
      cache.outside_.keep_pending_outside(p.window_begin, p.window_end);
      cache.tokens_.assign(p.tokens.begin(), p.tokens.begin() + p.length);
      cache.begin_ = p.window_begin;
      cache.end_ = p.window_end;
    }
  }

  // 2. Every window node against its cache's prefix and suffix (nothing stashed).
  blocks.clear();
  owner.clear();
  for (std::size_t i = 0; i < passes.size(); ++i) {
    const auto& p = passes[i];
    const index_t w = p.window_end - p.window_begin;
    for (index_t u = p.refresh ? 1 : 0; u < p.nodes(); ++u) {
      blocks.push_back(
          {&p.cache->outside_, p.tokens.subspan(sz(u * p.length + p.window_begin), sz(w)),
           std::span<const index_t>(positions).subspan(sz(p.window_begin), sz(w)), visible(w)});
      owner.push_back(i);
    }
  }
  if (!blocks.empty()) {
    const float* out = run(blocks, false);
    index_t row = 0;
    for (std::size_t i = 0; i < passes.size(); ++i) {
      const auto& p = passes[i];
      const index_t w = p.window_end - p.window_begin;
      const index_t nodes = p.nodes() - (p.refresh ? 1 : 0);
      if (nodes == 0) continue;
      sink.put(*ctx_, out + row * c.vocab_size, nodes * w, first[i] + (p.refresh ? p.length : 0));
      row += nodes * w;
    }
  }
  sink.finish(*ctx_);
}

}  // namespace specula::example
