// Conan test_package: the umbrella header compiles and links against specula::specula.
#include <specula/specula.hpp>

#include <cstdio>

int main() {
  // Philox4x32-10 known-answer test (Random123 kat_vectors: counter = key = 0).
  const specula::u32x4 out =
      specula::philox4x32_10(specula::u32x4{{0, 0, 0, 0}}, specula::u32x2{{0, 0}});
  const bool ok = out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu &&
                  out[3] == 0x9b00dbd8u;
  std::printf("specula %s: philox4x32_10 %s\n", SPECULA_VERSION_STRING, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
