#include "harness.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>
#include <utility>

namespace kvtest {
namespace {

std::vector<std::pair<std::string, TestFn>>& registry() {
  static std::vector<std::pair<std::string, TestFn>> tests;
  return tests;
}

}  // namespace

void fail(const char* file, int line, const std::string& what) {
  throw Failure{std::string(file) + ":" + std::to_string(line) + ": " + what};
}

Registrar::Registrar(const char* name, TestFn fn) {
  registry().emplace_back(name, fn);
}

kvtier::IoEngine io_engine_under_test() {
  static const kvtier::IoEngine engine = [] {
    const char* name = std::getenv("KVTIER_TEST_IO_ENGINE");
    return kvtier::parse_io_engine(name != nullptr && *name != '\0' ? name : "psync");
  }();
  return engine;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/kvtier-cpp-test.XXXXXX";
  std::vector<char> buffer(tmpl.begin(), tmpl.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr)
    throw std::runtime_error("mkdtemp(" + tmpl + ") failed: " + std::strerror(errno));
  path_ = buffer.data();
}

TempDir::~TempDir() {
  if (std::getenv("KVTEST_KEEP_TMP") != nullptr) {
    std::fprintf(stderr, "  (kept %s)\n", path_.c_str());
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::vector<unsigned char> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<unsigned char> out(n);
  std::uint64_t x = 0x9E3779B97F4A7C15ull ^ (std::uint64_t{seed} * 0xBF58476D1CE4E5B9ull);
  for (std::size_t i = 0; i < n; ++i) {
    // xorshift64*: cheap, and different seeds give unrelated streams.
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    out[i] = static_cast<unsigned char>((x * 0x2545F4914F6CDD1Dull) >> 56);
  }
  return out;
}

std::vector<std::string> tmp_files_below(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
      found.push_back(it->path().string());
  }
  return found;
}

void pop_exactly(kvtier::Engine& engine, std::size_t count, std::vector<kvtier::Completion>& out,
                 std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const std::size_t target = out.size() + count;
  while (out.size() < target) {
    auto got = engine.pop_completions(target - out.size());
    for (auto& c : got) out.push_back(std::move(c));
    if (out.size() >= target) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw Failure{"pop_exactly: only " + std::to_string(out.size()) + " of " +
                    std::to_string(target) + " completions after " + std::to_string(limit.count()) +
                    " s (hang?)"};
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::vector<kvtier::Completion> drain_and_pop(kvtier::Engine& engine, std::size_t count) {
  engine.drain();
  std::vector<kvtier::Completion> out = engine.pop_completions();
  if (out.size() != count)
    throw Failure{"drain_and_pop: expected " + std::to_string(count) + " completions, got " +
                  std::to_string(out.size())};
  if (!engine.pop_completions().empty())
    throw Failure{"drain_and_pop: more completions appeared after drain()"};
  return out;
}

void wait_until(const std::function<bool()>& predicate, const char* what,
                std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Failure{std::string("timed out waiting until ") + what + " (hang?)"};
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace kvtest

int main(int argc, char** argv) {
  auto& tests = kvtest::registry();
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      for (auto& [name, fn] : tests) std::printf("%s\n", name.c_str());
      return 0;
    }
    only.emplace_back(argv[i]);
  }
  if (kvtest::io_engine_under_test() == kvtier::IoEngine::kIoUring) {
    // The engine's own answer, through the public API: IoUringRefusedError where the kernel
    // refuses io_uring to this process.
    try {
      kvtest::TempDir probe;
      kvtier::EngineConfig config;
      config.set_root_dir(probe.path())
          .set_n_read_threads(1)
          .set_n_write_threads(0)
          .set_o_direct(kvtier::ODirectMode::kOff)
          .set_io_engine(kvtier::IoEngine::kIoUring);
      kvtier::Engine engine(config);
    } catch (const kvtier::IoUringRefusedError& e) {
      std::printf("SKIP: the io_uring engine is unavailable here: %s\n", e.what());
      return 77;  // SKIP_RETURN_CODE in tests/cpp/CMakeLists.txt
    }
  }
  int run = 0, failed = 0;
  for (auto& [name, fn] : tests) {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    ++run;
    std::printf("[ RUN  ] %s\n", name.c_str());
    std::fflush(stdout);
    std::string error;
    try {
      fn();
    } catch (const kvtest::Failure& f) {
      error = f.message;
    } catch (const std::exception& e) {
      error = std::string("unexpected exception: ") + e.what();
    } catch (...) {
      error = "unexpected non-standard exception";
    }
    if (error.empty()) {
      std::printf("[  OK  ] %s\n", name.c_str());
    } else {
      ++failed;
      std::printf("[ FAIL ] %s\n         %s\n", name.c_str(), error.c_str());
    }
    std::fflush(stdout);
  }
  if (run == 0) {
    std::printf("no test matched\n");
    return 2;
  }
  std::printf("%d test(s), %d failed\n", run, failed);
  return failed == 0 ? 0 : 1;
}
