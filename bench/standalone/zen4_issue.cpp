// Where an x86-64 core issues the row passes' instructions (core/simd.hpp): loops of
// independent instructions on data in L1, timed in cycles of a dependent add chain, and the
// residual pass written in assembly over whole rows, with and without the checks of
// check_level::reads. docs/PERFORMANCE.md ("Checked calls, fourth pass") reads the output on
// Zen 4. Not built by CMake (it needs AVX-512, and its point is the machine, not the library):
//
//   g++ -O2 -mavx512f -mavx512dq -mavx512bw -mavx512vl -o zen4_issue
//       bench/standalone/zen4_issue.cpp && ./zen4_issue

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

alignas(64) float buffer[256];

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Best of five: seconds per iteration of f(n).
template <class F>
double per_iteration(F f, long n) {
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    const double t0 = seconds_now();
    f(n);
    best = std::min(best, (seconds_now() - t0) / static_cast<double>(n));
  }
  return best;
}

#define SPECULA_PROBE(body)                                                                   \
  [](long n) {                                                                                \
    for (long i = 0; i < n; ++i)                                                              \
      asm volatile(body ::"r"(buffer)                                                         \
                   : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", \
                     "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",  \
                     "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");                            \
  }

#define CVT8                                                                         \
  "vcvtps2pd (%0), %%ymm0\n vcvtps2pd 16(%0), %%ymm1\n vcvtps2pd 32(%0), %%ymm2\n"   \
  "vcvtps2pd 48(%0), %%ymm3\n vcvtps2pd 64(%0), %%ymm4\n vcvtps2pd 80(%0), %%ymm5\n" \
  "vcvtps2pd 96(%0), %%ymm6\n vcvtps2pd 112(%0), %%ymm7\n"
#define SUB8                                                        \
  "vsubpd %%ymm8, %%ymm9, %%ymm0\n vsubpd %%ymm8, %%ymm9, %%ymm1\n" \
  "vsubpd %%ymm8, %%ymm9, %%ymm2\n vsubpd %%ymm8, %%ymm9, %%ymm3\n" \
  "vsubpd %%ymm8, %%ymm9, %%ymm4\n vsubpd %%ymm8, %%ymm9, %%ymm5\n" \
  "vsubpd %%ymm8, %%ymm9, %%ymm6\n vsubpd %%ymm8, %%ymm9, %%ymm7\n"
#define MAX8                                                          \
  "vmaxpd %%ymm8, %%ymm9, %%ymm10\n vmaxpd %%ymm8, %%ymm9, %%ymm11\n" \
  "vmaxpd %%ymm8, %%ymm9, %%ymm12\n vmaxpd %%ymm8, %%ymm9, %%ymm13\n" \
  "vmaxpd %%ymm8, %%ymm9, %%ymm14\n vmaxpd %%ymm8, %%ymm9, %%ymm15\n" \
  "vmaxpd %%ymm8, %%ymm9, %%ymm16\n vmaxpd %%ymm8, %%ymm9, %%ymm17\n"
#define MUL8                                                          \
  "vmulpd %%ymm8, %%ymm9, %%ymm18\n vmulpd %%ymm8, %%ymm9, %%ymm19\n" \
  "vmulpd %%ymm8, %%ymm9, %%ymm20\n vmulpd %%ymm8, %%ymm9, %%ymm21\n" \
  "vmulpd %%ymm8, %%ymm9, %%ymm22\n vmulpd %%ymm8, %%ymm9, %%ymm23\n" \
  "vmulpd %%ymm8, %%ymm9, %%ymm18\n vmulpd %%ymm8, %%ymm9, %%ymm19\n"
#define TERN8                                                                               \
  "vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm18\n vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm19\n" \
  "vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm20\n vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm21\n" \
  "vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm22\n vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm23\n" \
  "vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm18\n vpternlogd $0xfe, %%ymm8, %%ymm9, %%ymm19\n"
#define ZCVT4                                                                      \
  "vcvtps2pd (%0), %%zmm0\n vcvtps2pd 32(%0), %%zmm1\n vcvtps2pd 64(%0), %%zmm2\n" \
  "vcvtps2pd 96(%0), %%zmm3\n"
#define LOAD32x8                                                                 \
  "vmovups (%0), %%ymm0\n vmovups 32(%0), %%ymm1\n vmovups 64(%0), %%ymm2\n"     \
  "vmovups 96(%0), %%ymm3\n vmovups 128(%0), %%ymm4\n vmovups 160(%0), %%ymm5\n" \
  "vmovups 192(%0), %%ymm6\n vmovups 224(%0), %%ymm7\n"
#define LOAD64x8                                                              \
  "vmovups (%0), %%zmm0\n vmovups 64(%0), %%zmm1\n vmovups 128(%0), %%zmm2\n" \
  "vmovups 192(%0), %%zmm3\n vmovups (%0), %%zmm4\n vmovups 64(%0), %%zmm5\n" \
  "vmovups 128(%0), %%zmm6\n vmovups 192(%0), %%zmm7\n"

// The residual pass over a group of 16 entries of p and q (two vectors of four double lanes,
// conversions from 16-byte loads), and the checks of a checked call: 64-byte loads of both
// rows, an OR of their bits, their float sums.
#define RESIDUAL16                                                                         \
  "vcvtps2pd (%[p]), %%ymm0\n vcvtps2pd 16(%[p]), %%ymm1\n vcvtps2pd (%[q]), %%ymm2\n"     \
  "vcvtps2pd 16(%[q]), %%ymm3\n vcvtps2pd 32(%[p]), %%ymm4\n vcvtps2pd 48(%[p]), %%ymm5\n" \
  "vcvtps2pd 32(%[q]), %%ymm6\n vcvtps2pd 48(%[q]), %%ymm7\n"                              \
  "vsubpd %%ymm2, %%ymm0, %%ymm0\n vsubpd %%ymm3, %%ymm1, %%ymm1\n"                        \
  "vsubpd %%ymm6, %%ymm4, %%ymm4\n vsubpd %%ymm7, %%ymm5, %%ymm5\n"                        \
  "vmaxpd %%ymm15, %%ymm0, %%ymm0\n vmaxpd %%ymm15, %%ymm1, %%ymm1\n"                      \
  "vmaxpd %%ymm15, %%ymm4, %%ymm4\n vmaxpd %%ymm15, %%ymm5, %%ymm5\n"                      \
  "vfmadd231pd %%ymm14, %%ymm0, %%ymm8\n vfmadd231pd %%ymm14, %%ymm1, %%ymm9\n"            \
  "vfmadd231pd %%ymm14, %%ymm4, %%ymm8\n vfmadd231pd %%ymm14, %%ymm5, %%ymm9\n"
#define CHECK16                                         \
  "vmovups (%[p]), %%zmm16\n vmovups (%[q]), %%zmm17\n" \
  "vpternlogd $0xfe, %%zmm16, %%zmm17, %%zmm22\n"       \
  "vfmadd231ps %%zmm14, %%zmm16, %%zmm20\n vfmadd231ps %%zmm14, %%zmm17, %%zmm21\n"

template <bool Check>
void residual_rows(const float* p, const float* q, long groups) {
  asm volatile(
      "vxorpd %%ymm15, %%ymm15, %%ymm15\n vxorpd %%ymm8, %%ymm8, %%ymm8\n"
      "vxorpd %%ymm9, %%ymm9, %%ymm9\n vpternlogd $0xff, %%zmm14, %%zmm14, %%zmm14\n"
      "vpsrlq $54, %%zmm14, %%zmm14\n vpsllq $52, %%zmm14, %%zmm14\n"  // 1.0 in every lane
      "vxorps %%zmm20, %%zmm20, %%zmm20\n vxorps %%zmm21, %%zmm21, %%zmm21\n"
      "vxorps %%zmm22, %%zmm22, %%zmm22\n" ::
          : "xmm8", "xmm9", "xmm14", "xmm15", "xmm20", "xmm21", "xmm22");
  for (long g = 0; g < groups; ++g) {
    const float* pg = p + 16 * g;
    const float* qg = q + 16 * g;
    if constexpr (Check)
      asm volatile(RESIDUAL16 CHECK16::[p] "r"(pg), [q] "r"(qg)
                   : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm16",
                     "xmm17", "memory");
    else
      asm volatile(RESIDUAL16::[p] "r"(pg), [q] "r"(qg)
                   : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "memory");
  }
}

}  // namespace

int main() {
  // Cycles from a chain of dependent integer additions (one per cycle; four per iteration, the
  // loop's own counter on another chain).
  const double cycle =
      per_iteration(
          [](long n) {
            long x = 0;
            for (long i = 0; i < n; ++i)
              asm volatile("add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0" : "+r"(x));
          },
          100000000) /
      4.0;
  std::printf("clock about %.2f GHz\n", 1e-9 / cycle);
  struct probe {
    const char* what;
    void (*run)(long);
  };
  const probe probes[] = {
      {"8 conversions from 16-byte loads", SPECULA_PROBE(CVT8)},
      {"8 subtractions", SPECULA_PROBE(SUB8)},
      {"8 maxima", SPECULA_PROBE(MAX8)},
      {"8 multiplications", SPECULA_PROBE(MUL8)},
      {"8 conversions + 8 subtractions", SPECULA_PROBE(CVT8 SUB8)},
      {"8 conversions + 8 maxima", SPECULA_PROBE(CVT8 MAX8)},
      {"8 conversions + 8 multiplications", SPECULA_PROBE(CVT8 MUL8)},
      {"8 subtractions + 8 multiplications + 8 ternary ORs", SPECULA_PROBE(SUB8 MUL8 TERN8)},
      {"4 512-bit conversions from 32-byte loads", SPECULA_PROBE(ZCVT4)},
      {"8 loads of 32 bytes", SPECULA_PROBE(LOAD32x8)},
      {"8 loads of 64 bytes", SPECULA_PROBE(LOAD64x8)},
  };
  for (const probe& pr : probes)
    std::printf("%-52s %5.2f cycles per iteration\n", pr.what,
                per_iteration(pr.run, 20000000) / cycle);
  // The residual pass over 16 row pairs cycled (V = 1024: L1; 32000 and 128256: L2/L3).
  for (long v : {1024L, 32000L, 128256L}) {
    const long rows = v == 1024 ? 1 : 16;
    const long stride = v + 64;
    std::vector<float> storage(static_cast<std::size_t>(stride * 2 * rows + 64));
    const auto at = reinterpret_cast<std::uintptr_t>(storage.data());
    float* base = storage.data() + (64 - at % 64) % 64 / sizeof(float);  // 64-byte aligned
    for (long i = 0; i < stride * 2 * rows; ++i)
      base[i] = static_cast<float>((static_cast<unsigned long>(i) * 2654435761UL) % 1000) /
                (500.0f * static_cast<float>(v));
    double per_group[2];
    for (int check = 0; check < 2; ++check) {
      const long reps = 256 * 1024 / v + 1;
      per_group[check] = per_iteration(
                             [&](long n) {
                               for (long k = 0; k < n; ++k)
                                 for (long r = 0; r < rows; ++r) {
                                   const float* p = base + stride * 2 * r;
                                   if (check != 0)
                                     residual_rows<true>(p, p + stride, v / 16);
                                   else
                                     residual_rows<false>(p, p + stride, v / 16);
                                 }
                             },
                             reps) /
                         static_cast<double>(rows * (v / 16)) / cycle;
    }
    std::printf("residual pass, V = %6ld: %.2f cycles per group of 16 unchecked, %.2f checked\n", v,
                per_group[0], per_group[1]);
  }
  return 0;
}
