#include "fs/process.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace kvtier::detail {
namespace {

// 0 until read; a fork handler resets it in the child, so the child reads its own pid.
// clone() without fork handlers is only ever followed by exec here (posix_spawn).
std::atomic<pid_t> g_pid{0};

}  // namespace

pid_t current_pid() noexcept {
  static const bool registered = [] {
    ::pthread_atfork(nullptr, nullptr, [] { g_pid.store(0, std::memory_order_relaxed); });
    return true;
  }();
  (void)registered;
  pid_t pid = g_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = ::getpid();
    g_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

}  // namespace kvtier::detail
