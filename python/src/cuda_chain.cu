// The CUDA path of the chain bindings (see cuda_chain.hpp): stream-ordered scratch memory for
// the random streams, the offsets and the flattened tokens, the specula::cuda launch, and the
// scatter of the flattened tokens into vLLM's padded output. Nothing synchronises the stream.

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstring>

#include <specula/cuda/chain.cuh>

#include "cuda_chain.hpp"

namespace specula::python::cuda_path {

namespace {

std::string error_of(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();  // clear a sticky launch error for the next call
  return std::string("specula: ") + what + " failed on the GPU: " + cudaGetErrorName(e) + " (" +
         cudaGetErrorString(e) + ")";
}

/// Makes the arrays' device current for the call and restores the caller's afterwards.
struct device_scope {
  int previous = -1;
  cudaError_t status = cudaSuccess;
  explicit device_scope(int device) {
    status = cudaGetDevice(&previous);
    if (status == cudaSuccess && previous != device) status = cudaSetDevice(device);
  }
  ~device_scope() {
    if (previous >= 0) (void)cudaSetDevice(previous);
  }
};

/// Stream-ordered scratch memory, freed on the stream when the call returns (after the work
/// enqueued before it).
struct scratch {
  cudaStream_t stream;
  void* data = nullptr;
  cudaError_t status = cudaSuccess;
  scratch(cudaStream_t s, std::size_t bytes) : stream(s) {
    if (bytes > 0) status = cudaMallocAsync(&data, bytes, stream);
  }
  ~scratch() {
    if (data != nullptr) (void)cudaFreeAsync(data, stream);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
};

/// Pinned staging for the host → device copies of the random streams. A copy from pageable
/// memory would make cudaMemcpyAsync wait for the caller's stream (and the host with it); from
/// pinned memory it is a true asynchronous copy. A ring of slots, each with an event recorded
/// after its copy: a slot is rewritten only once its previous copy is done, which waits only
/// when `slots` calls of this thread are still in flight on their streams.
class pinned_staging {
 public:
  pinned_staging() = default;
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    for (slot& s : slots_) release(s);
  }

  /// Enqueues a copy of `bytes` bytes of host memory `src` to device memory `dst` on `stream`
  /// (of the current device `device`); `src` has been read when this returns.
  cudaError_t copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream, int device) {
    if (bytes == 0) return cudaSuccess;
    slot& s = slots_[next_++ % slots];
    if (s.done != nullptr) {
      if (const cudaError_t e = cudaEventSynchronize(s.done); e != cudaSuccess) return e;
      if (s.device != device) release(s);
    }
    if (s.done == nullptr) {
      if (const cudaError_t e = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming);
          e != cudaSuccess) {
        s.done = nullptr;
        return e;
      }
      s.device = device;
    }
    if (s.bytes < bytes) {
      if (s.host != nullptr) (void)cudaFreeHost(s.host);
      s.host = nullptr;
      s.bytes = 0;
      if (const cudaError_t e = cudaMallocHost(&s.host, bytes); e != cudaSuccess) {
        s.host = nullptr;
        return e;
      }
      s.bytes = bytes;
    }
    std::memcpy(s.host, src, bytes);
    if (const cudaError_t e = cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
      return e;
    return cudaEventRecord(s.done, stream);
  }

 private:
  struct slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t done = nullptr;
    int device = -1;
  };
  static constexpr std::size_t slots = 8;
  static void release(slot& s) {
    if (s.done != nullptr) {
      (void)cudaEventSynchronize(s.done);
      (void)cudaEventDestroy(s.done);
    }
    if (s.host != nullptr) (void)cudaFreeHost(s.host);
    s = slot{};
  }
  std::array<slot, slots> slots_{};
  std::size_t next_ = 0;
};

/// B host streams copied into `s` through this thread's pinned staging (see pinned_staging):
/// the copy is ordered on the stream and does not wait for it.
cudaError_t copy_rng(row_view<const request_rng> host, const scratch& s, int device) {
  if (s.status != cudaSuccess) return s.status;
  thread_local pinned_staging staging;
  return staging.copy(s.data, host.data, sizeof(request_rng) * static_cast<std::size_t>(host.size),
                      s.stream, device);
}

/// Request b's L_b + 1 tokens from the flattened layout (`flat`, `flat_size` tokens) into row b
/// of the padded output, -1 after. Offsets that would read outside `flat` (corrupt
/// cu_num_draft_tokens; the verifier flagged the request) give a row of -1.
template <class Offset>
__global__ void scatter_padded(const Offset* offsets, index_t batch, const token_t* flat,
                               index_t flat_size, token_t* padded, index_t width) {
  const index_t b = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const index_t start = static_cast<index_t>(offsets[b]) + b;
  const index_t n = static_cast<index_t>(offsets[b + 1] - offsets[b]) + 1;
  const bool in_bounds = start >= 0 && n >= 1 && start <= flat_size - n;
  for (index_t i = 0; i < width; ++i)
    padded[b * width + i] = in_bounds && i < n ? flat[start + i] : no_token;
}

template <class Input, class Output>
cudaError_t launch_rule(const cuda::par_policy& pol, const Input& in, const Output& out,
                        const chain_options& options, const device_rule& rule) {
  return std::visit(
      [&](const auto& r) { return cuda::verify_chain_async(pol, in, out, options, r); }, rule);
}

}  // namespace

template <class T>
std::string verify_padded(const launch& where, const padded_chain_input<T>& in,
                          const padded_chain_output& out, const chain_options& options,
                          const device_rule& rule) {
  const device_scope scope(where.device);
  if (scope.status != cudaSuccess) return error_of(scope.status, "selecting the device");
  const auto stream = reinterpret_cast<cudaStream_t>(where.stream);
  const scratch rng(stream, sizeof(request_rng) * static_cast<std::size_t>(in.batch_size));
  if (const cudaError_t e = copy_rng(in.rng, rng, where.device); e != cudaSuccess)
    return error_of(e, "copying the random streams");
  padded_chain_input<T> dev = in;
  dev.rng = {static_cast<const request_rng*>(rng.data), in.batch_size};
  return error_of(launch_rule(cuda::par_on(stream), dev, out, options, rule),
                  "chain verification (specula::cuda::verify_chain_async)");
}

template <class T>
std::string verify_flat(const launch& where, chain_batch_input<T> in, index_view cu, index_t batch,
                        chain_batch_output out, index_t padded_width, token_t* padded_tokens,
                        const chain_options& options, const device_rule& rule, bool greedy) {
  if (batch == 0) return {};
  const device_scope scope(where.device);
  if (scope.status != cudaSuccess) return error_of(scope.status, "selecting the device");
  const auto stream = reinterpret_cast<cudaStream_t>(where.stream);
  const index_t num_draft = in.draft_tokens.size;
  // Offsets: cu itself (B + 1 entries from 0), or 0 followed by vLLM's B cumulative counts.
  const bool wide = cu.data64 != nullptr;
  const std::size_t element = wide ? sizeof(std::int64_t) : sizeof(std::int32_t);
  const scratch offsets(stream,
                        cu.size == batch ? element * static_cast<std::size_t>(batch + 1) : 0);
  if (offsets.status != cudaSuccess) return error_of(offsets.status, "allocating offsets");
  if (cu.size == batch) {
    auto* dst = static_cast<char*>(offsets.data);
    const void* src = wide ? static_cast<const void*>(cu.data64) : cu.data32;
    cudaError_t e = cudaMemsetAsync(dst, 0, element, stream);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(dst + element, src, element * static_cast<std::size_t>(batch),
                          cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return error_of(e, "copying cu_num_draft_tokens");
    in.draft_offsets = wide ? index_view{static_cast<const std::int64_t*>(offsets.data), batch + 1}
                            : index_view{static_cast<const std::int32_t*>(offsets.data), batch + 1};
  } else {
    in.draft_offsets = cu;
  }
  const scratch rng(stream, greedy ? 0 : sizeof(request_rng) * static_cast<std::size_t>(batch));
  if (!greedy) {
    if (const cudaError_t e = copy_rng(in.rng, rng, where.device); e != cudaSuccess)
      return error_of(e, "copying the random streams");
    in.rng = {static_cast<const request_rng*>(rng.data), batch};
  }
  const scratch flat(
      stream, padded_width > 0 ? sizeof(token_t) * static_cast<std::size_t>(num_draft + batch) : 0);
  if (flat.status != cudaSuccess) return error_of(flat.status, "allocating the flattened tokens");
  if (padded_width > 0) {
    // -1 everywhere first: a flagged request writes only some of its slots, and the scatter
    // must copy -1, not uninitialised scratch, for the rest.
    if (const cudaError_t e = cudaMemsetAsync(
            flat.data, 0xff, sizeof(token_t) * static_cast<std::size_t>(num_draft + batch), stream);
        e != cudaSuccess)
      return error_of(e, "initialising the flattened tokens");
    out.output_tokens = {static_cast<token_t*>(flat.data), num_draft + batch};
  }
  const cudaError_t e = greedy ? cuda::verify_chain_greedy_async(cuda::par_on(stream), in, out)
                               : launch_rule(cuda::par_on(stream), in, out, options, rule);
  if (e != cudaSuccess)
    return error_of(e, "chain verification (specula::cuda::verify_chain_async)");
  if (padded_width > 0) {
    constexpr int threads = 128;
    const auto blocks = static_cast<unsigned>((batch + threads - 1) / threads);
    if (wide)
      scatter_padded<<<blocks, threads, 0, stream>>>(in.draft_offsets.data64, batch,
                                                     out.output_tokens.data, out.output_tokens.size,
                                                     padded_tokens, padded_width);
    else
      scatter_padded<<<blocks, threads, 0, stream>>>(in.draft_offsets.data32, batch,
                                                     out.output_tokens.data, out.output_tokens.size,
                                                     padded_tokens, padded_width);
    if (const cudaError_t s = cudaGetLastError(); s != cudaSuccess)
      return error_of(s, "writing output_token_ids");
  }
  return {};
}

template std::string verify_padded<float>(const launch&, const padded_chain_input<float>&,
                                          const padded_chain_output&, const chain_options&,
                                          const device_rule&);
template std::string verify_padded<double>(const launch&, const padded_chain_input<double>&,
                                           const padded_chain_output&, const chain_options&,
                                           const device_rule&);
template std::string verify_flat<float>(const launch&, chain_batch_input<float>, index_view,
                                        index_t, chain_batch_output, index_t, token_t*,
                                        const chain_options&, const device_rule&, bool);
template std::string verify_flat<double>(const launch&, chain_batch_input<double>, index_view,
                                         index_t, chain_batch_output, index_t, token_t*,
                                         const chain_options&, const device_rule&, bool);

}  // namespace specula::python::cuda_path
