// fork() with an engine at work: the child inherits the engine's memory but none of its worker
// threads. Its copy must refuse jobs and be destroyed without touching those threads (joining
// a thread that does not exist crashed the child) or locks they held; the parent's engine
// goes on as if nothing happened. A worker is parked on a gate across the fork, so work is
// running and queued at that moment in every run.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_helpers.hpp"

namespace {

using kvtest::block;
using kvtest::Gate;
using kvtest::TempDir;
using kvtier::Direction;
using kvtier::Engine;

constexpr std::size_t kBlock = 64 * 1024;
constexpr int kStores = 8;

// What the child checks, one exit code per failure (the parent reports which).
enum ChildResult : int {
  kOk = 0,
  kSubmitNotRefused = 10,
  kPopNotRefused,
  kDrainNotRefused,
  kStatsNotRefused,
  kNotShutDown,
  kWrongMessage,
  kOwnEngineFailed,
  kUnexpectedException,
};

// Whether `fn` throws std::runtime_error naming the fork; sets `message_ok`.
template <typename Fn>
bool refused(Fn&& fn, bool& message_ok) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    message_ok = message_ok && std::strstr(e.what(), "forked from it") != nullptr;
    return true;
  }
  return false;
}

int child_checks(std::unique_ptr<Engine>& inherited, const TempDir& dir) {
  try {
    bool message_ok = true;
    std::vector<unsigned char> data = kvtest::pattern(kBlock, 7);
    const auto submit = [&] {
      inherited->submit(99, Direction::kStore, {block(dir / "child", "c", data.data(), kBlock)});
    };
    if (!refused(submit, message_ok)) return kSubmitNotRefused;
    if (!refused([&] { inherited->pop_completions(); }, message_ok)) return kPopNotRefused;
    if (!refused([&] { inherited->drain(); }, message_ok)) return kDrainNotRefused;
    if (!refused([&] { (void)inherited->stats(); }, message_ok)) return kStatsNotRefused;
    if (!message_ok) return kWrongMessage;
    if (!inherited->is_shut_down()) return kNotShutDown;
    inherited->shutdown();  // nothing to stop here: returns at once
    inherited.reset();      // joined the parent's threads (a crash) before the fix
#if !defined(__SANITIZE_THREAD__)
    // An engine of the child's own works (ThreadSanitizer cannot start threads in a child of
    // a multi-threaded process, so that part runs only without it).
    TempDir own;
    Engine engine(kvtest::engine_config(own));
    std::vector<unsigned char> back(kBlock);
    if (!kvtest::store(engine, 1, own / "b", "k", data.data(), kBlock).success ||
        !kvtest::load(engine, 2, own / "b", "k", back.data(), kBlock).success || back != data)
      return kOwnEngineFailed;
#endif
    return kOk;
  } catch (...) {
    return kUnexpectedException;
  }
}

KV_TEST(forked_child_refuses_the_inherited_engine_and_drops_it_cleanly) {
  TempDir dir;
  auto engine =
      std::make_unique<Engine>(kvtest::gated_config(dir, kvtier::ODirectMode::kOff, 1, 0));
  Gate gate(dir / "gate");  // after the engine: released first if the test fails early
  std::vector<unsigned char> scratch(kBlock);
  engine->submit(1000, Direction::kLoad, {gate.op(scratch.data(), kBlock)});
  kvtest::wait_until([&] { return engine->stats().running_loads == 1; }, "the worker is parked");
  const std::vector<unsigned char> payload = kvtest::pattern(kBlock, 3);
  for (int i = 0; i < kStores; ++i)
    engine->submit(i, Direction::kStore,
                   {block(dir / ("s" + std::to_string(i)), "k" + std::to_string(i),
                          const_cast<unsigned char*>(payload.data()), kBlock)});

  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(child_checks(engine, dir));  // _exit: the parent's state stays its own
  CHECK(pid > 0);
  int status = 0;
  CHECK_EQ(::waitpid(pid, &status, 0), pid);
  CHECK_MSG(WIFEXITED(status), "child killed by signal " + std::to_string(WTERMSIG(status)));
  CHECK_EQ(WEXITSTATUS(status), static_cast<int>(kOk));

  // The parent's engine is untouched: the parked load and every queued store complete.
  gate.release();
  std::vector<kvtier::Completion> done;
  kvtest::pop_exactly(*engine, kStores + 1, done);
  for (const auto& c : done)
    if (c.job_id != 1000) CHECK_MSG(c.success, kvtest::describe(c));
  std::vector<unsigned char> back(kBlock);
  CHECK(kvtest::load(*engine, 2000, dir / "s0", "k0", back.data(), kBlock).success);
  CHECK(back == payload);
  CHECK(!engine->is_shut_down());
}

}  // namespace
