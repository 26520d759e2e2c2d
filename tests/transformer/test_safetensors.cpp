// The safetensors loader: round trips, and a clear error for every kind of broken file.

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include <specula_example/transformer.hpp>

#include "transformer_test_util.hpp"

using namespace specula;
using namespace specula::example;

namespace {

std::vector<std::uint8_t> model_bytes(const transformer_weights& w, dtype type = dtype::bf16) {
  return serialize_safetensors(w.to_tensors(type), {{"specula.config", w.config.to_json()}});
}

/// The load_error message of loading `bytes` as a model ("no error" when it loads).
std::string load_message(std::vector<std::uint8_t> bytes) {
  try {
    (void)transformer_weights::load(safetensors_file::parse(std::move(bytes), "model.safetensors"));
  } catch (const load_error& e) {
    return e.what();
  }
  return "no error";
}

/// A file image with `header` as its JSON header and `data_bytes` zero bytes of data.
std::vector<std::uint8_t> with_header(const std::string& header, std::size_t data_bytes = 0) {
  std::vector<std::uint8_t> out(8 + header.size() + data_bytes, 0);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

}  // namespace

TEST_CASE("safetensors round trip in F32 and BF16", "[backend]") {
  const transformer_weights w =
      example::testing::random_weights(example::testing::small_config(), 21);
  const auto f32 =
      transformer_weights::load(safetensors_file::parse(model_bytes(w, dtype::f32), "f32"));
  CHECK(f32.layers[1].w2 == w.layers[1].w2);
  CHECK(f32.config.to_json() == w.config.to_json());
  const auto b16 = transformer_weights::load(safetensors_file::parse(model_bytes(w), "bf16"));
  double worst = 0.0;
  for (std::size_t i = 0; i < w.output.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(b16.output[i] - w.output[i])) /
                                std::max(1e-30, std::abs(static_cast<double>(w.output[i]))));
  CHECK(worst <= 1.0 / 256.0);  // bf16 keeps 8 significant bits: relative error <= 2^-8
  CHECK(worst > 0.0);
  CHECK(b16.parameters() == w.parameters());
  // bf16 conversion: exact values survive, ties round to even.
  CHECK(example::detail::bf16_to_float(example::detail::float_to_bf16(1.5f)) == 1.5f);
  CHECK(example::detail::float_to_bf16(1.0f + 1.0f / 256.0f) ==
        example::detail::float_to_bf16(1.0f));
  CHECK(example::detail::f16_to_float(0x3c00) == 1.0f);
  CHECK(example::detail::f16_to_float(0xc000) == -2.0f);
  CHECK(example::detail::f16_to_float(0x0001) == std::ldexp(1.0f, -24));
}

TEST_CASE("truncated files are rejected", "[backend]") {
  const auto good =
      model_bytes(example::testing::random_weights(example::testing::small_config(), 22));
  CHECK(load_message(good) == "no error");
  CHECK_THAT(load_message({1, 2, 3}), Catch::Contains("model.safetensors: truncated file"));
  // Cut inside the header and inside the data section.
  for (const std::size_t keep : {std::size_t{20}, good.size() / 2, good.size() - 1}) {
    auto cut = good;
    cut.resize(keep);
    CHECK_THAT(load_message(cut), Catch::Contains("truncated file"));
  }
}

TEST_CASE("bad JSON headers are rejected", "[backend]") {
  CHECK_THAT(load_message(with_header("{not json")), Catch::Contains("bad JSON header"));
  CHECK_THAT(load_message(with_header("[1, 2]")), Catch::Contains("not an object"));
  CHECK_THAT(load_message(with_header(R"({"x": {"dtype": "F32", "shape": [2]}})")),
             Catch::Contains("tensor 'x': no 'data_offsets' pair"));
  CHECK_THAT(load_message(
                 with_header(R"({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8)),
             Catch::Contains("unsupported dtype Q4"));
  CHECK_THAT(load_message(with_header(
                 R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)),
             Catch::Contains("does not match its 8 bytes"));
  CHECK_THAT(load_message(with_header(R"({"__metadata__": {"a": 1}})")),
             Catch::Contains("is not a string"));
  // A well-formed file without the model's metadata.
  CHECK_THAT(load_message(with_header(
                 R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8)),
             Catch::Contains("missing metadata key 'specula.config'"));
}

TEST_CASE("wrong dtypes, shapes, missing tensors and bad configs are rejected", "[backend]") {
  const transformer_weights w =
      example::testing::random_weights(example::testing::small_config(), 23);
  const auto meta = std::map<std::string, std::string>{{"specula.config", w.config.to_json()}};

  auto tensors = w.to_tensors();
  tensors.erase(tensors.begin() + 3);  // layers.0.attention.wk.weight
  CHECK_THAT(load_message(serialize_safetensors(tensors, meta)),
             Catch::Contains("missing tensor 'layers.0.attention.wk.weight'"));

  tensors = w.to_tensors();
  tensors[2].shape = {16, 64};  // layers.0.attention.wq.weight, same size, wrong shape
  CHECK_THAT(load_message(serialize_safetensors(tensors, meta)),
             Catch::Contains(
                 "tensor 'layers.0.attention.wq.weight' has shape [16, 64]; expected [32, 32]"));

  tensors = w.to_tensors();
  tensors[0].type = dtype::i32;
  tensors[0].ints.assign(tensors[0].values.size(), 0);
  CHECK_THAT(
      load_message(serialize_safetensors(tensors, meta)),
      Catch::Contains("tensor 'tok_embeddings.weight' has dtype I32; expected F32, BF16 or F16"));

  auto bad = w.config;
  bad.n_kv_heads = 3;
  CHECK_THAT(
      load_message(serialize_safetensors(w.to_tensors(), {{"specula.config", bad.to_json()}})),
      Catch::Contains("n_kv_heads must divide n_heads"));
  CHECK_THAT(load_message(serialize_safetensors(w.to_tensors(), {{"specula.config", "{}"}})),
             Catch::Contains("specula.config has no field 'architecture'"));
  CHECK_THAT(
      load_message(serialize_safetensors(
          w.to_tensors(), {{"specula.config", R"({"architecture": "llama", "vocab_size": "x"})"}})),
      Catch::Contains("wrong type"));
  CHECK_THAT(load_message(serialize_safetensors(w.to_tensors(), {{"specula.config", "{"}})),
             Catch::Contains("bad JSON in metadata"));
  try {
    (void)safetensors_file::open("/nonexistent/model.safetensors");
    FAIL("no error");
  } catch (const load_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent/model.safetensors: cannot open file"));
  }
}
