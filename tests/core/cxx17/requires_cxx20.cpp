// Compiled as C++17 by the core.requires_cxx20 test, which expects specula's own message.
#include <specula/specula.hpp>

int main() { return 0; }
