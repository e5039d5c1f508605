#include "threadpool.h"

#include <chrono>
#include <cstdlib>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MLXPROG_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MLXPROG_PAUSE() asm volatile("yield")
#else
#define MLXPROG_PAUSE() ((void)0)
#endif

namespace mlxprog {

namespace {

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end || value < lo || value > hi) return fallback;
  return static_cast<int>(value);
}

int usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

}  // namespace

ThreadPool& ThreadPool::instance() {
  // Leaked on purpose: worker threads must not be joined during static
  // destruction at interpreter exit.
  static ThreadPool* pool = new ThreadPool(
      env_int("MLXPROG_NATIVE_THREADS", usable_cores(), 1, 256),
      env_int("MLXPROG_NATIVE_SPIN_US", 50, 0, 1000000));
  return *pool;
}

ThreadPool::ThreadPool(int threads, int spin_us) : spin_us_(spin_us) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) return;
    const int64_t end = begin + grain_ < n_ ? begin + grain_ : n_;
    (*body_)(begin, end);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const Body& body) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  std::unique_lock<std::mutex> lock(submit_, std::try_to_lock);
  if (workers_.empty() || n <= grain || !lock.owns_lock()) {
    body(0, n);
    return;
  }
  body_ = &body;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  open_.store(true);
  {
    std::lock_guard<std::mutex> sleep_lock(sleep_mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks();
  // Every chunk is taken: close the job to workers that have not joined yet
  // (a sleeping one may wake late) and wait for those that did. open_ and
  // active_ are sequentially consistent, so a worker either is counted here
  // or sees the job closed.
  open_.store(false);
  while (active_.load() != 0) MLXPROG_PAUSE();
  body_ = nullptr;
}

void ThreadPool::work(int) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for a new generation, then sleep until one comes.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      MLXPROG_PAUSE();
      if (++polls % 256 == 0 && std::chrono::steady_clock::now() > deadline) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    active_.fetch_add(1);
    if (open_.load()) run_chunks();
    active_.fetch_sub(1);
  }
}

}  // namespace mlxprog
