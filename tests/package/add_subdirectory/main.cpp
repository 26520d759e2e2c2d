// Consumer that builds specula via add_subdirectory.
#include <specula/specula.hpp>

#include <cstdio>

int main() {
  std::printf("specula %s\n", SPECULA_VERSION_STRING);
  return 0;
}
