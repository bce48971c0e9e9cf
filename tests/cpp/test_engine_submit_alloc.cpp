// The engine under memory pressure: this program replaces the global operator new with one
// that a thread can arm to fail after N allocations (or that fails every allocation of the
// engine's workers), and sweeps N across a call.
// - submit: after every failure nothing may be half-queued: drain() returns, the job id can
//   be submitted again, and that job and later ones work.
// - shutdown with queued work, and the pops after it: nothing on the cancellation path may
//   allocate (it is noexcept: an allocation failure there was std::terminate), and every job
//   is reported exactly once, cancelled blocks naming their path.
// - workers that cannot allocate: every block fails with ENOMEM, every job is reported.
// - a thread parked inside an allocation it makes under the scheduler's mutex: a submit on
//   another thread still returns at once, its jobs run in order once the mutex is free, and
//   one that cannot be queued for want of memory then is reported with ENOMEM.
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"

namespace {

// Allocations the arming thread may still make; -1 = unlimited. Thread-local, so the
// engine's workers (and the sanitizer runtimes) are never refused memory.
thread_local long t_allocations_left = -1;

// While set, every allocation made by one of the engine's worker threads (named "kvtier-*"
// by the engine) fails: memory pressure where the workers run, and only there.
std::atomic<bool> g_starve_workers{false};

bool on_worker_thread() {
  char name[16] = {};
  if (::pthread_getname_np(::pthread_self(), name, sizeof(name)) != 0) return false;
  return std::strncmp(name, "kvtier-", 7) == 0;
}

// While nonzero, the arming thread's next allocation of exactly this size parks it until
// g_release_parked: it then holds whatever lock it allocates under, for as long as a test
// needs.
thread_local std::size_t t_park_at_size = 0;
std::atomic<bool> g_parked{false}, g_release_parked{false};

void* allocate(std::size_t size) {
  if (t_park_at_size != 0 && size == t_park_at_size) {
    t_park_at_size = 0;
    g_parked = true;
    while (!g_release_parked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (t_allocations_left == 0) throw std::bad_alloc();
  if (t_allocations_left > 0) --t_allocations_left;
  if (g_starve_workers.load(std::memory_order_relaxed) && on_worker_thread())
    throw std::bad_alloc();
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
using kvtier::EngineConfig;
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

namespace {

// Job 1 parks the only worker in a gated load; jobs 2 (loads) and 3 (stores) wait behind it.
// shutdown() runs on a thread whose allocations fail after `n`; the cancellation must not
// need any. Returns whether shutdown() itself threw (it may only before cancelling anything).
bool shutdown_sweep_step(long n, long& left_over) {
  TempDir dir;
  const auto bytes = kvtest::pattern(8192, 9);
  EngineConfig config = kvtest::gated_config(dir, ODirectMode::kOff, 1, 0);
  {
    Engine writer(config);
    for (int i = 0; i < 2; ++i)
      CHECK(kvtest::store(writer, i, dir / ("in" + std::to_string(i)), "k", bytes.data(),
                          bytes.size())
                .success);
  }
  Engine engine(config);
  kvtest::Gate gate(dir / "gate");
  std::vector<std::vector<unsigned char>> buffers(4, std::vector<unsigned char>(bytes.size()));
  engine.submit(1, Direction::kLoad, {gate.op(buffers[0].data(), std::size_t{2} << 20)});
  kvtest::wait_until([&] { return engine.stats().running_loads == 1; }, "the worker is parked");
  // Long paths: a copy of one cannot hide in the small-string buffer.
  const std::string deep = "a-directory-name-long-enough-to-need-the-heap/";
  engine.submit(2, Direction::kLoad,
                {block(dir / ("in0"), "k", buffers[1].data(), bytes.size()),
                 block(dir / ("in1"), "k", buffers[2].data(), bytes.size())});
  std::vector<kvtier::BlockOp> stores;
  for (int i = 0; i < 3; ++i)
    stores.push_back(block(dir / (deep + std::to_string(i)), "k",
                           const_cast<unsigned char*>(bytes.data()), bytes.size()));
  engine.submit(3, Direction::kStore, stores);

  std::atomic<bool> threw{false};
  std::thread stopper([&] {
    t_allocations_left = n;
    try {
      engine.shutdown();
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    left_over = t_allocations_left;
    t_allocations_left = -1;
  });
  try {
    kvtest::wait_until([&] { return engine.is_shut_down() || threw; }, "shutdown has begun");
  } catch (...) {
    gate.release();
    stopper.join();
    throw;
  }
  gate.release();
  stopper.join();
  if (threw) engine.shutdown();  // again, with memory: it must finish the job

  // Popping under the same pressure: a conversion that fails puts the jobs back.
  std::vector<Completion> got;
  for (long m = 0; got.size() < 3 && m < 10'000; ++m) {
    std::vector<Completion> popped;
    t_allocations_left = m;
    try {
      popped = engine.pop_completions();
    } catch (const std::bad_alloc&) {
    }
    t_allocations_left = -1;
    for (Completion& c : popped) got.push_back(std::move(c));
  }
  for (Completion& c : engine.pop_completions()) got.push_back(std::move(c));
  CHECK_EQ(got.size(), std::size_t{3});
  std::map<kvtier::JobId, Completion> by_id;
  for (auto& c : got) CHECK_MSG(by_id.emplace(c.job_id, std::move(c)).second, "job reported twice");
  for (kvtier::JobId id : {2, 3}) {
    const Completion& c = by_id.at(id);
    CHECK(!c.success);
    CHECK_EQ(c.error.errno_value, ECANCELED);
    CHECK_EQ(c.error.operation, std::string("cancel"));
    CHECK_EQ(c.error.message, std::string("engine shut down before the block operation started"));
    CHECK_EQ(c.error.path, id == 2 ? dir / "in0" : dir / (deep + "0"));
    for (int e : c.block_errnos) CHECK_EQ(e, ECANCELED);
  }
  CHECK(!kvtest::file_exists(dir / (deep + "0")));
  return threw;
}

}  // namespace

KV_TEST(shutdown_with_queued_work_allocates_nothing_to_cancel) {
  long swept = 0;
  for (long n = 0;; ++n) {
    long left_over = -1;
    shutdown_sweep_step(n, left_over);
    ++swept;
    // Allocations left unused: shutdown got through with n of them, so every smaller budget
    // has been tried, and none killed the process.
    if (left_over > 0) break;
    CHECK_MSG(n < 10'000, "shutdown keeps allocating");
  }
  CHECK(swept >= 1);
}

KV_TEST(workers_that_cannot_allocate_fail_blocks_with_enomem) {
  TempDir dir;
  // Both directions, a worker of each kind; long paths so that a copy of one allocates.
  Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 1, 1));
  const auto bytes = kvtest::pattern(12'000, 5);  // unaligned length: staged copies
  std::vector<std::vector<unsigned char>> backs(8, std::vector<unsigned char>(bytes.size()));
  const std::string deep = "a-directory-name-long-enough-to-need-the-heap/";
  // Something to load, stored before the pressure starts.
  std::vector<kvtier::BlockOp> warm;
  for (int i = 0; i < 4; ++i)
    warm.push_back(block(dir / (deep + std::to_string(i)), "k",
                         const_cast<unsigned char*>(bytes.data()), bytes.size()));
  engine.submit(1, Direction::kStore, warm);
  for (const Completion& c : kvtest::drain_and_pop(engine, 1)) CHECK_MSG(c.success, describe(c));

  g_starve_workers = true;
  std::vector<kvtier::BlockOp> loads, stores;
  for (int i = 0; i < 4; ++i) {
    loads.push_back(block(dir / (deep + std::to_string(i)), "k", backs[i].data(), bytes.size()));
    stores.push_back(block(dir / (deep + "new" + std::to_string(i)), "k",
                           const_cast<unsigned char*>(bytes.data()), bytes.size()));
  }
  engine.submit(2, Direction::kLoad, loads);
  engine.submit(3, Direction::kStore, stores);
  std::vector<Completion> got;
  try {
    got = kvtest::drain_and_pop(engine, 2);
  } catch (...) {
    g_starve_workers = false;
    throw;
  }
  g_starve_workers = false;
  std::map<kvtier::JobId, Completion> by_id;
  for (auto& c : got) CHECK_MSG(by_id.emplace(c.job_id, std::move(c)).second, "job reported twice");
  CHECK_EQ(by_id.size(), std::size_t{2});
  CHECK(!by_id.at(2).success && !by_id.at(3).success);  // the pressure did hit them
  // Whatever failed, failed with ENOMEM and says where; nothing else may go wrong.
  for (auto& [id, c] : by_id) {
    for (int e : c.block_errnos) CHECK_MSG(e == 0 || e == ENOMEM, describe(c));
    if (!c.success) {
      CHECK_EQ(c.error.errno_value, ENOMEM);
      CHECK(!c.error.path.empty());
    }
  }
  // With memory again, the same engine works.
  engine.submit(4, Direction::kLoad, loads);
  for (const Completion& c : kvtest::drain_and_pop(engine, 1)) CHECK_MSG(c.success, describe(c));
  for (int i = 0; i < 4; ++i) CHECK(backs[i] == bytes);
}

namespace {

/// A path of exactly `length` characters below `dir`: its copy is an allocation of a size
/// nothing else in these tests asks for.
std::string path_of_length(const TempDir& dir, std::size_t length) {
  std::string p = dir / (std::string(200, 'a') + "/");
  CHECK(p.size() + 1 < length && length - p.size() < 255);
  return p + std::string(length - p.size(), 'b');
}

/// A store submitted on a thread of its own that parks while it holds the scheduler's mutex:
/// the first allocation of its path's length is the read-after-write tracker copying the path
/// (PendingStores::add, under the mutex). A submit that found the mutex busy (a worker still
/// starting) left its job to the intake thread instead, which does not park: it is drained
/// and submitted again (retries() counts those, each one inbox submit). release() lets the
/// parked one go; the destructor too.
class MutexHolder {
 public:
  MutexHolder(Engine& engine, const TempDir& dir, const std::vector<unsigned char>& bytes)
      : path_(path_of_length(dir, 400)) {
    g_parked = false;
    g_release_parked = false;
    thread_ = std::thread([this, &engine, &bytes] {
      for (int attempt = 0; attempt < 1000 && !g_release_parked.load(); ++attempt) {
        std::vector<kvtier::BlockOp> ops{
            block(path_, "k", const_cast<unsigned char*>(bytes.data()), bytes.size())};
        t_park_at_size = path_.size() + 1;  // the copy's characters and its terminator
        engine.submit(1, Direction::kStore, std::move(ops));
        t_park_at_size = 0;
        if (g_parked.load()) return;  // parked, and now released
        retries_.fetch_add(1);
        engine.drain();
        (void)engine.pop_completions();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!g_parked.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!g_parked.load()) {
      release();
      throw kvtest::Failure{"the holder's submit never copied its path under the mutex"};
    }
  }
  ~MutexHolder() { release(); }
  MutexHolder(const MutexHolder&) = delete;
  MutexHolder& operator=(const MutexHolder&) = delete;

  void release() {
    g_release_parked = true;
    if (thread_.joinable()) thread_.join();
  }
  std::uint64_t retries() const noexcept { return retries_.load(); }

 private:
  std::string path_;
  std::atomic<std::uint64_t> retries_{0};
  std::thread thread_;
};

/// Runs `submits` on a thread of its own; true when it returned within 10 s.
template <class F>
bool returns_promptly(F submits, std::thread& thread) {
  std::atomic<bool> done{false};
  thread = std::thread([&done, submits] {
    submits();
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done.load();
}

}  // namespace

KV_TEST(a_submit_never_waits_for_the_thread_holding_the_scheduler) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 1, 1));
  const auto bytes = kvtest::pattern(4096, 13);
  std::vector<unsigned char> back(bytes.size());
  const std::string path = dir / "inbox";
  std::thread submitter;
  bool prompt = false;
  std::uint64_t retries = 0;
  {
    MutexHolder holder(engine, dir, bytes);
    retries = holder.retries();
    // A store, a load of the same block (read-after-write must hold through the inbox) and a
    // job without blocks, all while the mutex is held.
    prompt = returns_promptly(
        [&] {
          engine.submit(2, Direction::kStore,
                        {block(path, "k", const_cast<unsigned char*>(bytes.data()), bytes.size())});
          engine.submit(3, Direction::kLoad, {block(path, "k", back.data(), back.size())});
          engine.submit(4, Direction::kStore, {});
        },
        submitter);
    CHECK(g_parked.load());  // still held when the submits returned (or gave up)
  }
  submitter.join();
  CHECK_MSG(prompt, "a submit waited for the thread that holds the scheduler's mutex");
  std::map<kvtier::JobId, Completion> by_id;
  for (Completion& c : kvtest::drain_and_pop(engine, 4)) {
    CHECK_MSG(c.success, describe(c));
    CHECK_MSG(by_id.emplace(c.job_id, std::move(c)).second, "job reported twice");
  }
  CHECK_EQ(by_id.size(), std::size_t{4});
  CHECK(back == bytes);
  CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});
  // All three went through the inbox: the first after its tries, the others behind it.
  CHECK_EQ(engine.stats().intake_submits, retries + 3);
}

KV_TEST(a_job_left_in_the_inbox_that_cannot_be_queued_fails_with_enomem) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 1, 1));
  const auto bytes = kvtest::pattern(4096, 17);
  const std::string path = path_of_length(dir, 300);  // queueing it copies the path
  std::thread submitter;
  bool prompt = false;
  {
    MutexHolder holder(engine, dir, bytes);
    prompt = returns_promptly(
        [&] {
          engine.submit(2, Direction::kStore,
                        {block(path, "k", const_cast<unsigned char*>(bytes.data()), bytes.size())});
        },
        submitter);
    submitter.join();
    // Whoever queues job 2 now cannot allocate: the intake thread and the workers (named
    // kvtier-*), and this thread, whose drain() takes the inbox too.
    g_starve_workers = true;
  }
  t_allocations_left = 0;
  engine.drain();
  t_allocations_left = -1;
  g_starve_workers = false;
  CHECK_MSG(prompt, "a submit waited for the thread that holds the scheduler's mutex");
  std::map<kvtier::JobId, Completion> by_id;
  for (Completion& c : kvtest::drain_and_pop(engine, 2))
    CHECK_MSG(by_id.emplace(c.job_id, std::move(c)).second, "job reported twice");
  const Completion& c = by_id.at(2);
  CHECK(!c.success);
  CHECK_EQ(c.error.errno_value, ENOMEM);
  CHECK_EQ(c.error.operation, std::string("store"));
  CHECK_EQ(c.error.path, path);
  CHECK_MSG(c.error.message.find("out of memory while queueing") != std::string::npos,
            c.error.message);
  for (int e : c.block_errnos) CHECK_EQ(e, ENOMEM);
  CHECK(!kvtest::file_exists(path));
  // The id is free again, and with memory the same job is stored.
  const Completion again = kvtest::store(engine, 2, path, "k", bytes.data(), bytes.size());
  CHECK_MSG(again.success, describe(again));
}
