// Consumer of an installed specula: only needs the umbrella header to compile.
#include <specula/specula.hpp>

#include <cstdio>

int main() {
  std::printf("specula %s\n", SPECULA_VERSION_STRING);
  return 0;
}
