// Compiled by the core.consumer_strict_warnings test as a consumer would: plain -I and strict
// warnings (-Wconversion, -Wsign-conversion, -Wshadow, ...), which must print nothing.
#include <specula/specula.hpp>

int main() { return 0; }
