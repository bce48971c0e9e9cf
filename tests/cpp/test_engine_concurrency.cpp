// Engine under concurrency: pop_completions() from many threads at once, drain() while
// another thread keeps submitting, and read-after-write per path (a load of a path whose
// store is still pending waits for it), including the same path stored twice, a failed
// store, shutdown with parked loads and every worker configuration, and submitters racing
// shutdown.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"

namespace {

using kvtest::block;
using kvtest::describe;
using kvtest::Gate;
using kvtest::TempDir;
using kvtier::Completion;
using kvtier::Direction;
using kvtier::Engine;
using kvtier::EngineConfig;
using kvtier::JobId;
using kvtier::ODirectMode;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kScale = 1;
#else
constexpr int kScale = 4;
#endif

std::map<JobId, Completion> by_id(std::vector<Completion> got) {
  std::map<JobId, Completion> out;
  for (auto& c : got)
    if (!out.emplace(c.job_id, std::move(c)).second)
      throw kvtest::Failure{"job " + std::to_string(c.job_id) + " reported twice"};
  return out;
}

}  // namespace

KV_TEST(many_consumers_each_job_exactly_once) {
  // Producers submit (stores, loads, zero-block jobs) while six threads pop at once with
  // different `max`: every job reaches exactly one consumer.
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 2, 2));
  const auto bytes = kvtest::pattern(5000, 3);
  constexpr int kProducers = 3;
  const int per_producer = 300 * kScale;
  const std::size_t total = std::size_t{kProducers} * per_producer;
  std::vector<std::vector<unsigned char>> sinks(total, std::vector<unsigned char>(bytes.size()));

  std::atomic<std::size_t> popped{0};
  std::atomic<bool> give_up{false};  // set by the hang guard, so every thread ends
  std::vector<std::vector<JobId>> seen(6);
  std::vector<std::thread> threads;
  for (int c = 0; c < 6; ++c) {
    threads.emplace_back([&, c] {
      while (popped.load() < total && !give_up.load()) {
        const auto got = engine.pop_completions(c % 3 == 0 ? 0 : std::size_t(c));
        for (const Completion& done : got) seen[c].push_back(done.job_id);
        popped.fetch_add(got.size());
        if (got.empty()) std::this_thread::yield();
      }
    });
  }
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int j = 0; j < per_producer && !give_up.load(); ++j) {
        const JobId id = JobId{p} * 100000 + j;
        const std::string path = dir / ("p" + std::to_string(p) + "/" + std::to_string(j % 20));
        std::vector<kvtier::BlockOp> ops;
        Direction d = Direction::kStore;
        if (j % 6 == 1) {
          d = Direction::kLoad;  // may miss or hit: only exactly-once matters here
          ops.push_back(block(path, "k", sinks[p * per_producer + j].data(), bytes.size()));
        } else if (j % 6 == 2) {
          ops.push_back(block(path, "k", const_cast<unsigned char*>(bytes.data()), bytes.size()));
        }  // else a zero-block job, which completes when queued: the most contention
        engine.submit(id, d, std::move(ops));
      }
    });
  }
  try {
    kvtest::wait_until([&] { return popped.load() >= total; }, "every job was popped",
                       std::chrono::seconds(300));
  } catch (...) {
    give_up = true;
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  std::set<JobId> all;
  for (const auto& ids : seen)
    for (JobId id : ids) CHECK_MSG(all.insert(id).second, "job " + std::to_string(id) + " twice");
  CHECK_EQ(all.size(), total);
  CHECK_EQ(popped.load(), total);
  CHECK(engine.pop_completions().empty());
  CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});
}

KV_TEST(drain_returns_while_another_thread_keeps_storing) {
  // A submitter keeps storing until drain() has returned (or a generous hang guard expires).
  // It also keeps one "gate" load in flight at every moment (it submits the next before it
  // lets the previous one finish), so the engine is never idle, deterministically. drain()
  // must return anyway, and every job submitted before it must be complete and poppable.
  TempDir dir;
  Engine engine(kvtest::gated_config(dir, ODirectMode::kOff, 2, 1));
  const auto bytes = kvtest::pattern(4096, 5);
  std::vector<unsigned char> scratch(4096);
  std::atomic<JobId> submitted{0};  // ids [0, submitted) have been submitted
  std::atomic<bool> drained{false};
  std::atomic<bool> gave_up{false};
  std::thread submitter([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::unique_ptr<Gate> held;
    JobId id = 0;
    while (!drained.load()) {
      if (std::chrono::steady_clock::now() > deadline) {  // hang guard, not a timing check
        gave_up = true;
        return;  // `held` is released: the engine can finish
      }
      if (engine.stats().jobs_in_flight >= 64) {
        std::this_thread::yield();
        continue;
      }
      auto next = std::make_unique<Gate>(dir / ("gate" + std::to_string(id)));
      engine.submit(id++, Direction::kLoad, {next->op(scratch.data(), scratch.size())});
      held = std::move(next);  // the previous gate's load may finish now
      engine.submit(id++, Direction::kStore,
                    {block(dir / ("s/" + std::to_string(id % 500)), "k",
                           const_cast<unsigned char*>(bytes.data()), bytes.size())});
      submitted.store(id);
    }
  });
  kvtest::wait_until([&] { return submitted.load() >= 100; }, "the submitter is busy");
  const JobId before = submitted.load();
  engine.drain();
  drained = true;
  // Whatever completed by now; the submitter may still add more, which are ignored.
  std::vector<Completion> got = engine.pop_completions();
  submitter.join();
  CHECK_MSG(!gave_up.load(), "drain() did not return while another thread kept submitting");
  std::set<JobId> done;
  for (const Completion& c : got) {
    if (c.job_id % 2 == 1) CHECK_MSG(c.success, describe(c));  // stores; gates fail (kGateErrno)
    done.insert(c.job_id);
  }
  for (JobId id = 0; id < before; ++id)
    CHECK_MSG(done.count(id) == 1, "job " + std::to_string(id) + " submitted before drain()");
  engine.drain();
}

KV_TEST(every_job_is_poppable_once_drain_returns) {
  // Workers publish a finished job after releasing the engine's mutex; drain() must still not
  // return before the completion of every job it waits for is in the queue. Round after
  // round, a burst of one-block jobs (each worker finishing one at about the same moment),
  // drain(), and one pop that must return the whole burst.
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 2, 2));
  const auto bytes = kvtest::pattern(512, 9);
  constexpr int kBurst = 8;
  const int rounds = 400 * kScale;
  JobId id = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int j = 0; j < kBurst; ++j, ++id)
      engine.submit(id, Direction::kStore,
                    {block(dir / ("d/" + std::to_string(id % 64)), "k",
                           const_cast<unsigned char*>(bytes.data()), bytes.size())});
    engine.drain();
    const std::vector<Completion> got = engine.pop_completions();
    CHECK_MSG(got.size() == std::size_t{kBurst}, "round " + std::to_string(round) + ": " +
                                                     std::to_string(got.size()) + " of " +
                                                     std::to_string(kBurst) + " poppable");
    for (const Completion& c : got) CHECK_MSG(c.success, describe(c));
  }
}

KV_TEST(load_waits_for_a_pending_store_of_its_path) {
  // One load-first worker, held by a gate. Behind it: a store of P, then a load of P. A
  // load-first worker would take the load first and miss; the load must wait for the store.
  TempDir dir;
  Engine engine(kvtest::gated_config(dir, ODirectMode::kOff, 1, 0));
  Gate gate(dir / "gate");
  std::vector<unsigned char> scratch(4096);
  engine.submit(1, Direction::kLoad, {gate.op(scratch.data(), scratch.size())});
  kvtest::wait_until([&] { return engine.stats().running_loads == 1; }, "the worker is held");
  const auto bytes = kvtest::pattern(10000, 7);
  std::vector<unsigned char> back(bytes.size());
  const std::string path = dir / "a/b/p";
  engine.submit(2, Direction::kStore,
                {block(path, "key", const_cast<unsigned char*>(bytes.data()), bytes.size())});
  engine.submit(3, Direction::kLoad, {block(path, "key", back.data(), back.size())});
  CHECK_EQ(engine.stats().queued_loads, std::uint64_t{1});
  gate.release();
  std::vector<Completion> got;
  kvtest::pop_exactly(engine, 3, got);
  auto jobs = by_id(std::move(got));
  CHECK_MSG(jobs.at(2).success, describe(jobs.at(2)));
  CHECK_MSG(jobs.at(3).success, describe(jobs.at(3)));
  CHECK(back == bytes);
}

KV_TEST(load_after_two_stores_and_after_a_failed_store) {
  // The same path stored twice (the second a dedup or a lost rename race: both succeed), and
  // a store that fails (its parent is a regular file): the loads behind them run once those
  // stores are done, the first byte-exact, the second failing like any miss. Nothing hangs.
  TempDir dir;
  Engine engine(kvtest::gated_config(dir, ODirectMode::kOff, 1, 0));
  Gate gate(dir / "gate");
  std::vector<unsigned char> scratch(4096);
  engine.submit(1, Direction::kLoad, {gate.op(scratch.data(), scratch.size())});
  kvtest::wait_until([&] { return engine.stats().running_loads == 1; }, "the worker is held");
  const auto bytes = kvtest::pattern(6000, 8);
  auto* data = const_cast<unsigned char*>(bytes.data());
  std::vector<unsigned char> back(bytes.size()), back2(bytes.size());
  const std::string path = dir / "twice";
  {
    const int fd = ::open((dir / "file").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    ::close(fd);
  }
  const std::string bad = dir / "file/under-a-file";
  engine.submit(2, Direction::kStore, {block(path, "k", data, bytes.size())});
  engine.submit(3, Direction::kStore, {block(path, "k", data, bytes.size())});
  engine.submit(4, Direction::kLoad, {block(path, "k", back.data(), back.size())});
  engine.submit(5, Direction::kStore, {block(bad, "k", data, bytes.size())});
  engine.submit(6, Direction::kLoad, {block(bad, "k", back2.data(), back2.size())});
  gate.release();
  std::vector<Completion> got;
  kvtest::pop_exactly(engine, 6, got);
  auto jobs = by_id(std::move(got));
  for (JobId id : {2, 3, 4}) CHECK_MSG(jobs.at(id).success, describe(jobs.at(id)));
  CHECK(back == bytes);
  CHECK(!jobs.at(5).success);
  CHECK(!jobs.at(6).success);
  CHECK_EQ(jobs.at(6).error.errno_value, ENOTDIR);  // a real miss, not a cancellation
}

KV_TEST(shutdown_cancels_parked_loads) {
  // The worker is held in a second gate while a load of P is parked behind a store of P that
  // has not started: shutdown() fails both with ECANCELED and reports them.
  TempDir dir;
  Engine engine(kvtest::gated_config(dir, ODirectMode::kOff, 1, 0));
  Gate first(dir / "gate1");
  Gate second(dir / "gate2");
  std::vector<unsigned char> scratch(4096), back(4096);
  engine.submit(1, Direction::kLoad, {first.op(scratch.data(), scratch.size())});
  kvtest::wait_until([&] { return engine.stats().running_loads == 1; }, "the worker is held");
  const auto bytes = kvtest::pattern(4096, 9);
  engine.submit(2, Direction::kStore,
                {block(dir / "p", "k", const_cast<unsigned char*>(bytes.data()), bytes.size())});
  engine.submit(3, Direction::kLoad, {block(dir / "p", "k", back.data(), back.size())});
  engine.submit(4, Direction::kLoad, {second.op(scratch.data(), scratch.size())});
  first.release();
  std::vector<Completion> got;
  kvtest::pop_exactly(engine, 1, got);  // job 1; the worker then parks job 3, takes job 4
  kvtest::wait_until([&] { return engine.stats().running_loads == 1; }, "held again");
  std::thread stopper([&] { engine.shutdown(); });
  try {
    kvtest::pop_exactly(engine, 2, got);  // reported before shutdown() joins the worker
  } catch (...) {
    second.release();
    stopper.join();
    throw;
  }
  second.release();
  stopper.join();
  kvtest::pop_exactly(engine, 1, got);
  auto jobs = by_id(std::move(got));
  for (JobId id : {2, 3}) {
    CHECK_EQ(jobs.at(id).error.errno_value, ECANCELED);
    CHECK_EQ(jobs.at(id).error.operation, std::string("cancel"));
  }
  CHECK_EQ(jobs.at(4).error.errno_value, kvtest::kGateErrno);  // ran to its end
  CHECK(!kvtest::file_exists(dir / "p"));
  CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});
}

KV_TEST(read_after_write_in_every_worker_configuration) {
  // Store then load of the same fresh path, back to back, with the store cap and load-first
  // workers in every combination (including none): every load sees its store's bytes, every
  // job completes (pop_exactly's hang guard catches a deadlock).
  const unsigned configs[][2] = {{1, 0}, {0, 1}, {0, 2}, {1, 1}, {2, 2}, {3, 1}};
  for (const auto& [readers, writers] : configs) {
    TempDir dir;
    EngineConfig config = kvtest::engine_config(dir, ODirectMode::kOff, readers, writers);
    config.set_max_stores_in_flight_while_loading(1);
    Engine engine(config);
    const int n = 40 * kScale;
    std::vector<std::vector<unsigned char>> sources, backs;
    for (int i = 0; i < n; ++i) {
      sources.push_back(kvtest::pattern(4096 + 512 * (i % 5), 200 + i));
      backs.emplace_back(sources.back().size());
    }
    for (int i = 0; i < n; ++i) {
      const std::string path = dir / ("k/" + std::to_string(i));
      std::vector<kvtier::BlockOp> store_ops{
          block(path, "k", sources[i].data(), sources[i].size())};
      if (i % 4 == 0 && i > 0)  // the previous path once more, in the same job
        store_ops.push_back(block(dir / ("k/" + std::to_string(i - 1)), "k", sources[i - 1].data(),
                                  sources[i - 1].size()));
      engine.submit(2 * i, Direction::kStore, std::move(store_ops));
      engine.submit(2 * i + 1, Direction::kLoad,
                    {block(path, "k", backs[i].data(), backs[i].size())});
    }
    std::vector<Completion> got;
    kvtest::pop_exactly(engine, 2 * n, got);
    for (const Completion& c : got)
      CHECK_MSG(c.success, describe(c) + " readers " + std::to_string(readers) + " writers " +
                               std::to_string(writers));
    for (int i = 0; i < n; ++i) CHECK_MSG(backs[i] == sources[i], "block " + std::to_string(i));
  }
}

KV_TEST(submitters_racing_shutdown_get_each_job_refused_or_reported_once) {
  // Submitters on many threads while another shuts the engine down: with this many threads
  // on the scheduler's mutex some submits find it busy and leave their job in the inbox
  // (Scheduler::submit), so shutdown meets jobs in every state. Each job is either refused
  // by its submit (EngineShutDownError) or reported exactly once, and none is lost.
  TempDir dir;
  const auto bytes = kvtest::pattern(4096, 31);
  for (int round = 0; round < 2 * kScale; ++round) {
    Engine engine(kvtest::engine_config(dir, ODirectMode::kOff, 2, 2));
    constexpr int kThreads = 8;
    std::vector<std::vector<JobId>> accepted(kThreads);
    std::atomic<int> refused{0};
    std::atomic<std::size_t> n_submitted{0};
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int j = 0;; ++j) {
          const JobId id = JobId(t) << 40 | JobId(j);  // a submit that finds the mutex busy
                                                       // takes ~0.1 us: ids never collide
          std::vector<kvtier::BlockOp> ops;
          if (j % 5 != 4)  // and now and then a job without blocks
            ops.push_back(block(dir / ("r" + std::to_string(round) + "/" + std::to_string(id)),
                                "k", const_cast<unsigned char*>(bytes.data()), bytes.size()));
          try {
            engine.submit(id, Direction::kStore, std::move(ops));
          } catch (const kvtier::EngineShutDownError&) {
            refused.fetch_add(1);
            return;
          }
          accepted[t].push_back(id);
          n_submitted.fetch_add(1);
        }
      });
    // Shut down while they submit, later in each round.
    const std::size_t threshold = 500u * (round + 1);
    while (n_submitted.load() < threshold) std::this_thread::yield();
    engine.shutdown();
    for (auto& t : threads) t.join();
    std::vector<Completion> got;
    for (auto& c : engine.pop_completions()) got.push_back(std::move(c));
    const auto reported = by_id(std::move(got));
    std::size_t n_accepted = 0;
    for (int t = 0; t < kThreads; ++t)
      for (JobId id : accepted[t]) {
        ++n_accepted;
        const auto it = reported.find(id);
        CHECK_MSG(it != reported.end(), "job " + std::to_string(id) + " was never reported");
        const Completion& c = it->second;
        CHECK_MSG(c.success || c.error.errno_value == ECANCELED, describe(c));
      }
    CHECK_EQ(reported.size(), n_accepted);  // nothing reported that a submit refused
    CHECK_EQ(refused.load(), kThreads);     // every submitter ended on a refusal
    CHECK_EQ(engine.stats().jobs_in_flight, std::uint64_t{0});
  }
}
