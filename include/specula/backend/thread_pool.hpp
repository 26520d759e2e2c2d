#pragma once

/// @file
/// The host's bulk-task interface and its default implementation, a persistent thread pool.
///
/// `bulk_task` is what the library hands to an executor: a non-owning reference to a callable
/// `task(i)` that never throws. `thread_pool` runs `bulk(n, task)` on threads started once, with
/// the calling thread taking part; `default_pool()` is the process-wide pool behind `host::par`,
/// started on first use. See backend/host.hpp for the policies and the `executor` concept.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "specula/core/types.hpp"

namespace specula::host {

/// A non-owning reference to the task body of one bulk call: `task(i)` runs task i. Calls never
/// throw (the library catches inside the task and rethrows on the calling thread), may be made
/// from any thread and concurrently, and are valid until the bulk call that received the task
/// returns. Trivially copyable, so an executor can capture it by value.
class bulk_task {
 public:
  /// Refers to `f`, which must outlive every call.
  template <class F>
  requires(!std::same_as<std::remove_cvref_t<F>, bulk_task>) &&
      std::is_nothrow_invocable_v<F&, index_t> explicit bulk_task(F& f) noexcept
      : object_(static_cast<void*>(&f)),
  call_([](void* object, index_t i) noexcept { (*static_cast<F*>(object))(i); }) {}

  void operator()(index_t i) const noexcept { call_(object_, i); }

 private:
  void* object_;
  void (*call_)(void*, index_t) noexcept;
};

/// A pool of `threads - 1` worker threads started at construction and joined at destruction;
/// the thread calling `bulk` is the remaining one. Any number of threads may call `bulk` at the
/// same time, including from inside a task (nested calls): every caller runs its own call's tasks
/// until none is left, and workers help whichever calls have tasks left, so a call always
/// completes even if no worker ever comes (e.g. all are busy, or in a child after fork()).
class thread_pool {
 public:
  /// `threads`: the calling thread plus `threads - 1` workers; 0 means one per hardware thread.
  explicit thread_pool(unsigned threads = 0) {
    unsigned total = threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
    workers_.reserve(total - 1);
    for (unsigned t = 1; t < total; ++t) workers_.emplace_back([this] { work(); });
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Joins the workers. No call to `bulk` may be in progress.
  ~thread_pool() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  /// Threads that can run tasks of one call: the workers plus the caller.
  [[nodiscard]] index_t concurrency() const noexcept {
    return static_cast<index_t>(workers_.size()) + 1;
  }

  /// Runs task(0), ..., task(n - 1) and returns when all have returned. Tasks are claimed one at
  /// a time by the caller and by at most `concurrency() - 1` workers.
  void bulk(index_t n, bulk_task task) { bulk(n, task, concurrency()); }

  /// As above with at most `max_threads` threads (caller included) on this call.
  void bulk(index_t n, bulk_task task, index_t max_threads) {
    if (n <= 0) return;
    const index_t helpers =
        std::min({max_threads - 1, static_cast<index_t>(workers_.size()), n - 1});
    if (helpers <= 0) {
      for (index_t i = 0; i < n; ++i) task(i);
      return;
    }
    job j{task, n, helpers};
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      j.next_job = jobs_;
      jobs_ = &j;
    }
    if (helpers == 1)
      wake_.notify_one();
    else
      wake_.notify_all();
    drain(j);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      for (job** p = &jobs_; *p != nullptr; p = &(*p)->next_job)
        if (*p == &j) {
          *p = j.next_job;
          break;
        }
    }
    // No worker joins once the job is unlisted; wait for those still running its tasks, first
    // briefly without sleeping (they are usually finishing their last task).
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (j.active.load(std::memory_order_acquire) != 0 &&
           std::chrono::steady_clock::now() < spin_until)
      std::this_thread::yield();
    if (j.active.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return j.active.load(std::memory_order_acquire) == 0; });
    }
  }

 private:
  struct job {
    bulk_task task;
    index_t count;
    index_t max_helpers;
    std::atomic<index_t> next{0};
    index_t helpers = 0;             // workers that joined (under mutex_)
    std::atomic<index_t> active{0};  // workers still running its tasks (joined under mutex_)
    job* next_job = nullptr;

    job(bulk_task t, index_t n, index_t h) : task(t), count(n), max_helpers(h) {}
  };

  static void drain(job& j) {
    for (index_t i = j.next.fetch_add(1, std::memory_order_relaxed); i < j.count;
         i = j.next.fetch_add(1, std::memory_order_relaxed))
      j.task(i);
  }

  /// A listed job a worker may join (under mutex_).
  job* joinable() const {
    for (job* j = jobs_; j != nullptr; j = j->next_job)
      if (j->helpers < j->max_helpers && j->next.load(std::memory_order_relaxed) < j->count)
        return j;
    return nullptr;
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      job* j = nullptr;
      wake_.wait(lock, [&] { return stopping_ || (j = joinable()) != nullptr; });
      if (stopping_) return;
      ++j->helpers;
      j->active.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      drain(*j);
      // The caller may return as soon as this reaches 0: j is not touched afterwards.
      const bool last = j->active.fetch_sub(1, std::memory_order_acq_rel) == 1;
      lock.lock();
      if (last) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;  // workers: a job was listed, or stop
  std::condition_variable done_;  // callers: a job's last helper left
  job* jobs_ = nullptr;           // listed jobs, newest first (under mutex_)
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

/// The process-wide pool behind `host::par`: one thread per hardware thread (the caller
/// included), started on first use and joined at exit.
inline thread_pool& default_pool() {
  static thread_pool pool;
  return pool;
}

}  // namespace specula::host
