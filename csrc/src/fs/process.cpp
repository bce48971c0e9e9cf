#include "fs/process.hpp"

#include <pthread.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace kvtier::detail {
namespace {

// 0 until read; a fork handler resets both in the child, so the child reads its own pid and
// draws its own token. clone() without fork handlers is only ever followed by exec here
// (posix_spawn).
std::atomic<pid_t> g_pid{0};
std::atomic<std::uint64_t> g_token{0};

void register_fork_handler() noexcept {
  static const bool registered = [] {
    ::pthread_atfork(nullptr, nullptr, [] {
      g_pid.store(0, std::memory_order_relaxed);
      g_token.store(0, std::memory_order_relaxed);
    });
    return true;
  }();
  (void)registered;
}

std::uint64_t draw_token() noexcept {
  std::uint64_t token = 0;
  for (;;) {
    const ssize_t n = ::getrandom(&token, sizeof(token), 0);
    if (n == static_cast<ssize_t>(sizeof(token))) break;
    if (n < 0 && errno == EINTR) continue;
    // No getrandom (kernels before 3.17, seccomp): mix what differs between processes. Only
    // uniqueness matters here, not secrecy.
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    token = (static_cast<std::uint64_t>(ts.tv_sec) * 1000000007ULL) ^
            (static_cast<std::uint64_t>(ts.tv_nsec) << 20) ^
            reinterpret_cast<std::uintptr_t>(&token) ^ static_cast<std::uint64_t>(::getpid());
    token *= 0x9E3779B97F4A7C15ULL;
    break;
  }
  return token;
}

}  // namespace

pid_t current_pid() noexcept {
  register_fork_handler();
  pid_t pid = g_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = ::getpid();
    g_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

std::uint64_t process_token() noexcept {
  register_fork_handler();
  std::uint64_t token = g_token.load(std::memory_order_relaxed);
  while (token == 0) {
    std::uint64_t drawn = draw_token();
    if (drawn == 0) continue;
    // Two threads drawing at once agree on the first stored token.
    if (g_token.compare_exchange_strong(token, drawn, std::memory_order_relaxed)) token = drawn;
  }
  return token;
}

}  // namespace kvtier::detail
