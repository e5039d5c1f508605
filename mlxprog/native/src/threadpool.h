// A small thread pool for the kernels: workers plus the calling thread.
//
// A job splits [0, n) into chunks of `grain` that the threads take in turn.
// After a job, workers spin for a short while (most kernels of a decode step
// follow each other within microseconds) and then sleep. A job submitted
// while another runs (another MLX stream, another Python thread) runs on its
// caller's thread alone, so the pool never deadlocks or nests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlxprog {

class ThreadPool {
 public:
  using Body = std::function<void(int64_t, int64_t)>;

  // The process's pool: MLXPROG_NATIVE_THREADS threads (the calling one
  // included), else one per core this process may run on.
  static ThreadPool& instance();

  explicit ThreadPool(int threads, int spin_us);
  ~ThreadPool();

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // body(begin, end) over chunks of [0, n), in parallel; returns when all ran.
  void parallel_for(int64_t n, int64_t grain, const Body& body);

 private:
  void work(int index);
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex submit_;          // one job at a time
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};  // workers inside the current job
  std::atomic<bool> open_{false};  // the job still takes workers
  std::atomic<bool> stop_{false};
  const Body* body_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  int spin_us_;
};

}  // namespace mlxprog
