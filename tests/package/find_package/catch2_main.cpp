// Built against specula::catch2 alone: the target carries the testing kit and Catch2.
#define CATCH_CONFIG_MAIN
#include <specula/testing/catch2.hpp>
#include <vector>

TEST_CASE("a fair coin is lossless against itself") {
  const std::vector<double> p = {0.5, 0.5};
  SPECULA_REQUIRE_LOSSLESS(p, [](auto& src) {
    return src.bernoulli(0.5, specula::draw_id{}) ? specula::index_t{1} : specula::index_t{0};
  });
}
