// Conan test_package (with_cuda=True): the CUDA headers compile with nvcc and link cudart.
// Needs no GPU: device_count() is 0 without one.
#include <specula/cuda/error.cuh>
#include <specula/specula.hpp>

#include <cstdio>

int main() {
  std::printf("specula %s: %d CUDA device(s)\n", SPECULA_VERSION_STRING,
              specula::cuda::device_count());
  return 0;
}
