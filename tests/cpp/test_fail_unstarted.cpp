// Engine::fail_unstarted: the blocks not started beneath a directory (queued stores and
// loads, loads parked behind a store) fail with ETIMEDOUT while the engine keeps running;
// the other blocks of the same jobs run, a failed block never runs later, and every job is
// reported exactly once, also with submitters and callers on several threads at once.
// Workers are held on gates (engine_helpers.hpp), so the queues are in a known state.
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"

namespace {

using kvtest::block;
using kvtest::Gate;
using kvtest::TempDir;
using kvtier::Completion;
using kvtier::Direction;
using kvtier::Engine;

constexpr std::size_t kBlock = 16 * 1024;
constexpr kvtier::JobId kGateJob = 999;

void check_errnos(const Completion& c, const std::vector<int>& expected) {
  CHECK_MSG(c.block_errnos == expected, kvtest::describe(c));
}

std::map<kvtier::JobId, Completion> by_id(std::vector<Completion> completions) {
  std::map<kvtier::JobId, Completion> out;
  for (Completion& c : completions) {
    const kvtier::JobId id = c.job_id;
    CHECK_MSG(out.emplace(id, std::move(c)).second, "job " + std::to_string(id) + " twice");
  }
  return out;
}

KV_TEST(fails_queued_and_parked_blocks_beneath_the_directory_only) {
  TempDir dir;
  // Two load-only workers (free) and one store worker, held on a gate while the queues fill.
  Engine engine(kvtest::gated_config(dir, kvtier::ODirectMode::kOff, 2, 1));
  Gate gate(dir / "gate");
  engine.submit(kGateJob, Direction::kStore, {gate.store_op(kBlock)});
  kvtest::wait_until([&] { return engine.stats().running_stores == 1; }, "store worker held");

  const std::vector<unsigned char> payload = kvtest::pattern(kBlock, 7);
  auto source = const_cast<unsigned char*>(payload.data());
  // "ab" shares the prefix "a" but does not lie beneath dir/a.
  engine.submit(1, Direction::kStore,
                {block(dir / "a/1", "a1", source, kBlock),
                 block(dir / "ab/1", "ab1", source, kBlock),
                 block(dir / "a/2", "a2", source, kBlock)});
  engine.submit(2, Direction::kStore, {block(dir / "a/3", "a3", source, kBlock)});
  // Both blocks of job 3 park behind job 1's stores (read-after-write); job 4 runs at once
  // (no file: ENOENT), and once it is reported the load workers have parked job 3's blocks.
  kvtest::Memory parked_a(kBlock, 0), parked_ab(kBlock, 0), absent(kBlock, 0);
  engine.submit(3, Direction::kLoad,
                {block(dir / "a/1", "a1", parked_a.data(), kBlock),
                 block(dir / "ab/1", "ab1", parked_ab.data(), kBlock)});
  engine.submit(4, Direction::kLoad, {block(dir / "b/9", "b9", absent.data(), kBlock)});
  std::vector<Completion> out;
  kvtest::pop_exactly(engine, 1, out);
  CHECK_EQ(out[0].job_id, kvtier::JobId{4});
  CHECK_EQ(engine.stats().queued_loads, std::uint64_t{2});

  // a/1, a/2 (job 1), a/3 (job 2) and the parked a/1 load (job 3).
  CHECK_EQ(engine.fail_unstarted(dir / "a/"), std::size_t{4});
  CHECK_EQ(engine.fail_unstarted(dir / "a"), std::size_t{0});  // reported once, not again
  // Job 2 had nothing else to run: reported at once, while the store worker is still held.
  out.clear();
  kvtest::pop_exactly(engine, 1, out);
  CHECK_EQ(out[0].job_id, kvtier::JobId{2});
  CHECK(!out[0].success);
  CHECK_EQ(out[0].error.errno_value, ETIMEDOUT);
  check_errnos(out[0], std::vector<int>{ETIMEDOUT});
  CHECK_MSG(out[0].error.message.find("degraded") != std::string::npos, out[0].error.message);
  CHECK_EQ(engine.stats().queued_stores, std::uint64_t{1});  // ab/1 still waits its turn

  // The rest runs as usual once the worker is free: ab/1 is stored, then loaded.
  gate.release();
  const auto done = by_id(kvtest::drain_and_pop(engine, 3));
  check_errnos(done.at(1), std::vector<int>{ETIMEDOUT, 0, ETIMEDOUT});
  CHECK_EQ(done.at(1).error.errno_value, ETIMEDOUT);
  check_errnos(done.at(3), std::vector<int>{ETIMEDOUT, 0});
  CHECK(parked_ab.equals(payload));
  // The failed blocks never ran: no file written, the failed load's memory untouched.
  CHECK(!kvtest::file_exists(dir / "a/1"));
  CHECK(!kvtest::file_exists(dir / "a/2"));
  CHECK(!kvtest::file_exists(dir / "a/3"));
  CHECK(kvtest::file_exists(dir / "ab/1"));
  CHECK(parked_a.equals(std::vector<unsigned char>(kBlock, 0xEE)));
  CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});

  CHECK_THROWS(std::invalid_argument, engine.fail_unstarted(""));
  engine.shutdown();
  CHECK_EQ(engine.fail_unstarted(dir.path()), std::size_t{0});
}

KV_TEST(queued_loads_and_the_rest_of_a_mixed_job) {
  TempDir dir;
  // One worker, held; the loads queue behind it (nothing parks: no store is pending).
  Engine engine(kvtest::gated_config(dir, kvtier::ODirectMode::kOff, 1, 0));
  const std::vector<unsigned char> payload = kvtest::pattern(kBlock, 3);
  CHECK(kvtest::store(engine, 1, dir / "b/1", "b1", payload.data(), kBlock).success);
  kvtest::Memory scratch(kBlock, 0);
  Gate gate(dir / "gate");
  engine.submit(kGateJob, Direction::kLoad, {gate.op(scratch.data(), kBlock)});
  kvtest::wait_until([&] { return engine.stats().running_loads == 1; }, "the worker held");
  kvtest::Memory m1(kBlock, 0), m2(kBlock, 0), m3(kBlock, 0), m4(kBlock, 0);
  // Job 2: beneath a, b, a, b: the worker takes b/1 and b/1 again, skipping the failed ones.
  engine.submit(2, Direction::kLoad,
                {block(dir / "a/1", "a1", m1.data(), kBlock),
                 block(dir / "b/1", "b1", m2.data(), kBlock),
                 block(dir / "a/2", "a2", m3.data(), kBlock),
                 block(dir / "b/1", "b1", m4.data(), kBlock)});
  CHECK_EQ(engine.fail_unstarted(dir / "a"), std::size_t{2});
  CHECK_EQ(engine.stats().queued_loads, std::uint64_t{2});
  gate.release();
  auto done = by_id(kvtest::drain_and_pop(engine, 2));
  check_errnos(done.at(kGateJob), std::vector<int>{kvtest::kGateErrno});
  check_errnos(done.at(2), std::vector<int>{ETIMEDOUT, 0, ETIMEDOUT, 0});
  CHECK(m2.equals(payload));
  CHECK(m4.equals(payload));
  const std::vector<unsigned char> untouched(kBlock, 0xEE);
  CHECK(m1.equals(untouched));
  CHECK(m3.equals(untouched));
}

KV_TEST(drain_for_gives_up_while_a_block_is_held) {
  TempDir dir;
  Engine engine(kvtest::gated_config(dir, kvtier::ODirectMode::kOff, 1, 0));
  kvtest::Memory scratch(kBlock, 0);
  Gate gate(dir / "gate");
  engine.submit(kGateJob, Direction::kLoad, {gate.op(scratch.data(), kBlock)});
  CHECK(!engine.drain_for(0.05));  // the held load cannot finish: gives up
  CHECK(engine.pop_completions().empty());
  CHECK_THROWS(std::invalid_argument, engine.drain_for(-1));
  gate.release();
  CHECK(engine.drain_for(120));  // a hang guard, not a timing check
  CHECK_EQ(engine.pop_completions().size(), std::size_t{1});
  CHECK(engine.drain_for(0));  // nothing left: drained at once
}

// Submitters on several threads, a caller failing dir/a now and then, the workers taking
// blocks meanwhile: each job reported once, ETIMEDOUT only beneath dir/a, as many as the calls
// said. (For TSan and ASan: .ci/cpp-sanitizers.sh.)
KV_TEST(concurrent_submitters_and_callers_report_every_job_once) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, kvtier::ODirectMode::kOff, 2, 2));
  constexpr int kThreads = 4, kJobs = 150, kBlocks = 4;
  const std::vector<unsigned char> payload = kvtest::pattern(kBlock, 11);
  std::vector<std::vector<unsigned char>> memory(kThreads * kBlocks,
                                                 std::vector<unsigned char>(kBlock));
  std::atomic<int> running{kThreads};
  std::atomic<std::size_t> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int j = 0; j < kJobs; ++j) {
        const kvtier::JobId id = static_cast<kvtier::JobId>(t * kJobs + j + 1);
        const bool is_load = j % 3 == 2;
        std::vector<kvtier::BlockOp> blocks;
        for (int b = 0; b < kBlocks; ++b) {
          const std::string name = std::string((j + b) % 2 == 0 ? "a/" : "b/") +
                                   std::to_string(t) + "-" + std::to_string(b);
          void* data = is_load ? memory[static_cast<std::size_t>(t * kBlocks + b)].data()
                               : const_cast<unsigned char*>(payload.data());
          blocks.push_back(block(dir / name, name, data, kBlock));
        }
        // A load job waits for this thread's earlier loads: its memory is reused.
        engine.submit(id, is_load ? Direction::kLoad : Direction::kStore, std::move(blocks));
        if (is_load) engine.drain();
      }
      running.fetch_sub(1);
    });
  threads.emplace_back([&] {
    while (running.load() > 0) {
      failed.fetch_add(engine.fail_unstarted(dir / "a"));
      std::this_thread::yield();
    }
  });
  for (std::thread& th : threads) th.join();
  const auto done = by_id(kvtest::drain_and_pop(engine, kThreads * kJobs));
  std::size_t timed_out = 0;
  for (const auto& [id, c] : done) {
    CHECK_EQ(c.block_errnos.size(), std::size_t{kBlocks});
    const int j = static_cast<int>((id - 1) % kJobs);
    for (int b = 0; b < kBlocks; ++b) {
      if (c.block_errnos[static_cast<std::size_t>(b)] != ETIMEDOUT) continue;
      CHECK_MSG((j + b) % 2 == 0, "ETIMEDOUT outside dir/a: " + kvtest::describe(c));
      ++timed_out;
    }
  }
  CHECK_EQ(timed_out, failed.load());
  CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});
}

}  // namespace
