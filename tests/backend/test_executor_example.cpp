// The executor example of docs/api.md, compiled and run against a stand-in for an engine's
// thread pool.

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include <specula/verify.hpp>

namespace my_engine {

/// An engine's pool, as far as the example needs it: parallel_for(n, f) runs f(0..n-1) on
/// threads and returns when all have returned (here: one thread per call of f).
struct pool {
  int calls = 0;
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& f) {
    std::vector<std::thread> threads;
    for (std::int64_t i = 0; i < n; ++i) {
      ++calls;
      threads.emplace_back(f, i);
    }
    for (auto& t : threads) t.join();
  }
};

}  // namespace my_engine

//! [executor_example]
struct engine_executor {  // adapts an engine's pool
  my_engine::pool* pool;
  void bulk(specula::index_t n, specula::host::bulk_task task) {
    pool->parallel_for(n, [task](std::int64_t i) { task(i); });  // blocks until all ran
  }
};
//! [executor_example]

TEST_CASE("docs/api.md example: verifying on an engine's executor", "[core][backend]") {
  // Two requests of one draft each (V = 2), one-hot drafts.
  const std::vector<float> p = {0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.75f, 0.5f, 0.5f};
  const std::vector<specula::index_t> offsets = {0, 1, 2};
  const std::vector<specula::token_t> drafts = {0, 1};
  const std::vector<specula::request_rng> rng = {{3, 0, 0}, {3, 1, 0}};
  std::vector<specula::token_t> out(4), ref(4);
  std::vector<std::int32_t> accepted(2), ref_accepted(2);
  const specula::chain_batch_input<float> in{2, offsets, drafts, {}, {p.data(), 4, 2}, rng};
  my_engine::pool engine_pool;
  //! [executor_call]
  engine_executor ex{&engine_pool};
  specula::verify_chain(specula::host::on(ex), in,
                        specula::chain_batch_output{out, accepted, {}, {}});
  //! [executor_call]
  specula::verify_chain(specula::host::seq, in,
                        specula::chain_batch_output{ref, ref_accepted, {}, {}});
  CHECK(engine_pool.calls > 0);
  CHECK(out == ref);
  CHECK(accepted == ref_accepted);
}
