// Engine::submit under memory pressure: this program replaces the global operator new with
// one that the test thread can arm to fail after N allocations, and sweeps N across a
// submit call. After every failure nothing may be half-queued: drain() returns, the job id
// can be submitted again, and that job and later ones work.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"

namespace {

// Allocations the arming thread may still make; -1 = unlimited. Thread-local, so the
// engine's workers (and the sanitizer runtimes) are never refused memory.
thread_local long t_allocations_left = -1;

void* allocate(std::size_t size) {
  if (t_allocations_left == 0) throw std::bad_alloc();
  if (t_allocations_left > 0) --t_allocations_left;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

}  // namespace

// The replaceable forms that take and free malloc memory (the aligned forms keep the
// library's own pair).
void* operator new(std::size_t size) {
  return allocate(size);
}
void* operator new[](std::size_t size) {
  return allocate(size);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return allocate(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return ::operator new(size, std::nothrow);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace {

using kvtest::block;
using kvtest::describe;
using kvtest::TempDir;
using kvtier::Completion;
using kvtier::Direction;
using kvtier::Engine;
using kvtier::ODirectMode;

// drain() with a hang guard: a half-queued job makes drain() wait forever, and a stuck
// thread cannot be cancelled, so the program reports and exits.
void drain_or_die(Engine& engine, const char* context, long n) {
  std::atomic<bool> done{false};
  std::thread drainer([&] {
    engine.drain();
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!done.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!done.load()) {
    std::fprintf(stderr, "FAIL: drain() hangs after %s failed at allocation %ld\n", context, n);
    std::fflush(stderr);
    std::_Exit(1);
  }
  drainer.join();
}

// Sweeps the allocation that fails across one submit of `direction` with many blocks (the
// queue grows by several chunks, the read-after-write table by one entry per block).
void sweep(Direction direction) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 1, 1));
  constexpr int kBlocks = 64;  // crosses deque chunk boundaries wherever the queue stands
  const auto bytes = kvtest::pattern(4096, 21);
  std::vector<std::vector<unsigned char>> backs(kBlocks, std::vector<unsigned char>(bytes.size()));
  auto ops = [&] {
    std::vector<kvtier::BlockOp> out;
    for (int b = 0; b < kBlocks; ++b) {
      void* data = direction == Direction::kStore ? const_cast<unsigned char*>(bytes.data())
                                                  : static_cast<void*>(backs[b].data());
      out.push_back(block(dir / ("b/" + std::to_string(b)), "k", data, bytes.size()));
    }
    return out;
  };
  if (direction == Direction::kLoad) {  // something to load
    engine.submit(0, Direction::kStore, [&] {
      auto out = ops();
      for (auto& op : out) op.data = const_cast<unsigned char*>(bytes.data());
      return out;
    }());
    for (const Completion& c : kvtest::drain_and_pop(engine, 1)) CHECK_MSG(c.success, describe(c));
  }
  const char* what = direction == Direction::kStore ? "a store submit" : "a load submit";
  long failures = 0;
  for (long n = 0;; ++n) {
    std::vector<kvtier::BlockOp> job = ops();
    bool failed = false;
    t_allocations_left = n;
    try {
      engine.submit(1, direction, std::move(job));
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    t_allocations_left = -1;
    drain_or_die(engine, what, n);
    if (failed) {
      ++failures;
      CHECK_MSG(engine.pop_completions().empty(), "a failed submit was reported");
      CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});
      CHECK_EQ(engine.stats().queued_loads + engine.stats().queued_stores, std::uint64_t{0});
      engine.submit(1, direction, ops());  // the id is free again
    }
    for (const Completion& c : kvtest::drain_and_pop(engine, 1)) {
      CHECK_MSG(c.success, describe(c) + " after allocation " + std::to_string(n) + " failed");
      CHECK_EQ(c.block_errnos.size(), std::size_t{kBlocks});
    }
    if (direction == Direction::kLoad)
      for (auto& back : backs) {
        CHECK(back == bytes);
        std::fill(back.begin(), back.end(), 0);
      }
    if (!failed) break;  // n allocations were enough: the sweep has covered the whole call
  }
  CHECK(failures >= 3);  // the sweep went past the first allocations of the call
  // Later work is unaffected.
  engine.submit(2, direction, ops());
  for (const Completion& c : kvtest::drain_and_pop(engine, 1)) CHECK_MSG(c.success, describe(c));
}

}  // namespace

KV_TEST(store_submit_is_all_or_nothing_under_allocation_failure) {
  sweep(Direction::kStore);
}

KV_TEST(load_submit_is_all_or_nothing_under_allocation_failure) {
  sweep(Direction::kLoad);
}
