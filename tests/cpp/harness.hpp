#pragma once

// A deliberately tiny test harness (no external framework is available offline).
//
//   KV_TEST(name) { ... }      defines and registers a test function
//   CHECK(cond)                fails the current test with file:line and the expression
//   CHECK_EQ(a, b)             the same, printing both values
//   CHECK_THROWS(Type, expr)   expr must throw Type (or a subclass)
//   FAIL(message)              unconditional failure
//
// A failed check throws kvtest::Failure, which ends the current test; the runner (main, in
// harness.cpp) goes on with the next test and exits non-zero if any failed. Checks are for
// the test's own thread: worker threads record what they saw and the test thread checks it.
// Running a test binary with names as arguments runs only those tests; --list lists them.

#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <kvtier/kvtier.hpp>

namespace kvtest {

struct Failure {
  std::string message;  // "file:line: what failed"
};

[[noreturn]] void fail(const char* file, int line, const std::string& what);

using TestFn = void (*)();
struct Registrar {
  Registrar(const char* name, TestFn fn);
};

template <typename T>
std::string show(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<long long>(value));
  } else if constexpr (std::is_same_v<T, unsigned char> || std::is_same_v<T, signed char>) {
    return std::to_string(static_cast<int>(value));
  } else {
    std::ostringstream out;
    out << value;
    return out.str();
  }
}

/// A fresh directory from mkdtemp (under $TMPDIR, else /tmp), removed with its contents when
/// the test ends (kept when KVTEST_KEEP_TMP is set, for post-mortems).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const noexcept { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// The engine the tests run on: KVTIER_TEST_IO_ENGINE ("psync", the default, or "io_uring"),
/// so that every engine test runs on both (tests/cpp/CMakeLists.txt adds one entry each).
kvtier::IoEngine io_engine_under_test();

/// Deterministic pseudo-random bytes (seeded), so a failure reproduces.
std::vector<unsigned char> pattern(std::size_t n, std::uint32_t seed);

/// Regular files below `dir` whose name ends in ".tmp" (left-over store files).
std::vector<std::string> tmp_files_below(const std::string& dir);

/// Polls `engine` until `count` completions have been popped in total, appending them to
/// `out`. Fails the test after `limit` (a hang guard, not a timing assertion).
void pop_exactly(kvtier::Engine& engine, std::size_t count, std::vector<kvtier::Completion>& out,
                 std::chrono::seconds limit = std::chrono::seconds(120));

/// drain() then pop every completion; checks that exactly `count` jobs were reported.
std::vector<kvtier::Completion> drain_and_pop(kvtier::Engine& engine, std::size_t count);

/// Waits (polling, with a hang guard) until `predicate` holds.
void wait_until(const std::function<bool()>& predicate, const char* what,
                std::chrono::seconds limit = std::chrono::seconds(60));

}  // namespace kvtest

#define KVTEST_CONCAT_(a, b) a##b
#define KVTEST_CONCAT(a, b) KVTEST_CONCAT_(a, b)

#define KV_TEST(name)                                                                   \
  static void name();                                                                   \
  static const ::kvtest::Registrar KVTEST_CONCAT(kvtest_registrar_, name){#name, name}; \
  static void name()

#define FAIL(message) ::kvtest::fail(__FILE__, __LINE__, std::string(message))

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) ::kvtest::fail(__FILE__, __LINE__, "CHECK(" #cond ")"); \
  } while (0)

#define CHECK_MSG(cond, message)                                                         \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::kvtest::fail(__FILE__, __LINE__, std::string("CHECK(" #cond "): ") + (message)); \
  } while (0)

#define CHECK_EQ(a, b)                                                          \
  do {                                                                          \
    const auto& kvtest_a_ = (a);                                                \
    const auto& kvtest_b_ = (b);                                                \
    if (!(kvtest_a_ == kvtest_b_))                                              \
      ::kvtest::fail(__FILE__, __LINE__,                                        \
                     "CHECK_EQ(" #a ", " #b "): " + ::kvtest::show(kvtest_a_) + \
                         " != " + ::kvtest::show(kvtest_b_));                   \
  } while (0)

#define CHECK_THROWS(Type, expr)                                                               \
  do {                                                                                         \
    bool kvtest_threw_ = false;                                                                \
    try {                                                                                      \
      (void)(expr);                                                                            \
    } catch (const Type&) {                                                                    \
      kvtest_threw_ = true;                                                                    \
    }                                                                                          \
    if (!kvtest_threw_)                                                                        \
      ::kvtest::fail(__FILE__, __LINE__, "CHECK_THROWS(" #Type ", " #expr "): did not throw"); \
  } while (0)
