// resident_ssd_decode / resident_stepwise_decode (resident_ssd.hpp) on the host transformer: the
// library's diffusion loops driven by a resident rows policy that keeps only each row's summary
// (what the device ops copy back) equal stepwise decoding — the reference the loops are defined
// by — for chain and mix-order trees, without a cache and with the dual cache.

#include <catch2/catch.hpp>

#include <filesystem>
#include <vector>

#include <specula/decode/ssd.hpp>
#include <specula_example/resident_ssd.hpp>

#include "toy_sd_gtest.hpp"

using namespace specula;
using namespace specula::example;

TEST_CASE("resident SSD and stepwise decoding with host rows equal stepwise decoding",
          "[backend][models]") {
  const std::filesystem::path dir{SPECULA_MODELS_DIR};
  const auto model = transformer::load(dir / "text-diffusion.safetensors");
  resident_ssd_rows<transformer> rows(model);
  const auto& prompts = decode_testing::text_prompts();
  for (const auto cache : {ssd_cache::none, ssd_cache::dual}) {
    decode_stats st;
    for (std::size_t i = 0; i < 2; ++i) {
      const auto prompt = decode_testing::bytes(prompts[i]);
      ssd_options opt = example::testing::small_ssd_options(cache);
      const auto ref = diffusion_stepwise_decode(model, prompt, opt);
      INFO("prompt " << prompts[i] << ", dual cache " << (cache == ssd_cache::dual));
      CHECK(resident_stepwise_decode(model, rows, prompt, opt) == ref);
      CHECK(resident_ssd_decode(model, rows, prompt, opt, &st) == ref);
      opt.tree = ssd_tree::mix_order;
      opt.draft_length = 4;
      CHECK(resident_ssd_decode(model, rows, prompt, opt, &st) == ref);
    }
    CHECK(st.step_compression() > 1.0);
  }
}
