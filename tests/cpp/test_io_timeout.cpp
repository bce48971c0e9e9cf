// EngineConfig::io_timeout_s: block operations stuck in the kernel fail their jobs with
// ETIMEDOUT, the engine stops waiting for them, stuck workers are replaced (up to the cap),
// drain() and shutdown() return, and a late kernel answer never touches the caller's memory.
//
// The stall is real and in the kernel: this program defines preadv and pwritev (the calls the
// psync engine makes), which the core library resolves to these definitions. While armed, a
// call on a file whose path contains "/stall" first blocks in read(2) on a pipe until the test
// releases it, then makes the real system call. The tests run on psync (the io_uring engine's
// reads never pass through libc; tests/python/test_io_timeout.py stalls both engines over a
// frozen FUSE mount). unlinkat is defined the same way (armed on its own, for a name that
// contains "stall"): the removal of a block that failed its checksum. No timing is asserted:
// every wait is a hang guard.
//
// A load from a file system that holds only memory (tmpfs without swap, ramfs) is read after
// the worker claimed its batch, without the deadline (docs/core.md, "Loads from memory"): the
// tests that expect a stuck read to be abandoned therefore need their directories elsewhere,
// and use the current directory (ctest's: the build tree) where TMPDIR is such a file system.
// The last tests stall reads on /dev/shm on purpose.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"
#include "harness.hpp"

namespace {

// ---- the stall: a pipe the test writes to ------------------------------------------------

std::atomic<bool> g_armed{false};
std::atomic<bool> g_unlink_armed{false};  // stalls unlinkat instead (arm_unlink)
std::atomic<int> g_pipe_read{-1};
std::atomic<int> g_pipe_write{-1};
std::atomic<int> g_entered{0};   // calls that stalled
std::atomic<int> g_returned{0};  // of those, returned from the real system call
// A rename onto a name containing "stall" first sleeps this long: a publish that is slow but
// well inside a deadline (a third of ShmRoot's), after a write that took three.
std::atomic<int> g_rename_delay_ms{0};
// fstat of a file whose path contains "/stall" stalls, then fails with EIO, as a soft-mounted
// server that stopped answering does (arm_fstat).
std::atomic<bool> g_fstat_armed{false};

bool stalled_path(int fd) {
  char link[64];
  char target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::strstr(target, "/stall") != nullptr;
}

// The stall itself: counts the call in, then blocks in read(2) until release().
void stall_until_released() {
  g_entered.fetch_add(1);
  char c;
  while (::read(g_pipe_read.load(), &c, 1) < 0 && errno == EINTR) {
  }
}

// Returns whether the call stalled (it then counts its return).
bool maybe_stall(int fd) {
  if (!g_armed.load() || !stalled_path(fd)) return false;
  stall_until_released();
  return true;
}

// Arms a fresh pipe (the bytes of an earlier release must not let this stall through).
void arm() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  g_pipe_read.store(fds[0]);
  g_pipe_write.store(fds[1]);
  g_entered.store(0);
  g_returned.store(0);
  g_armed.store(true);
}

// Arms the stall for unlinkat only (preadv and pwritev pass).
void arm_unlink() {
  arm();
  g_armed.store(false);
  g_unlink_armed.store(true);
}

// Arms the stall for fstat only (the other calls pass).
void arm_fstat() {
  arm();
  g_armed.store(false);
  g_fstat_armed.store(true);
}

// Lets every stalled call (and any later one) through. The pipe stays open: a released call
// may still be about to read it.
void release() {
  g_armed.store(false);
  g_unlink_armed.store(false);
  g_fstat_armed.store(false);
  const char bytes[256] = {};
  if (::write(g_pipe_write.load(), bytes, sizeof bytes) < 0)
    throw std::runtime_error("release: write failed");
}

// Releases at scope exit, so a failing test never leaves a worker stuck for good.
struct ReleaseAtExit {
  ~ReleaseAtExit() {
    if (g_armed.load() || g_unlink_armed.load() || g_fstat_armed.load()) release();
  }
};

}  // namespace

extern "C" ssize_t preadv(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  const bool stalled = maybe_stall(fd);
  const ssize_t n = ::syscall(SYS_preadv, fd, iov, iovcnt, static_cast<long>(offset), 0L);
  if (stalled) g_returned.fetch_add(1);
  return n;
}

extern "C" ssize_t pwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  const bool stalled = maybe_stall(fd);
  const ssize_t n = ::syscall(SYS_pwritev, fd, iov, iovcnt, static_cast<long>(offset), 0L);
  if (stalled) g_returned.fetch_add(1);
  return n;
}

extern "C" int fstat(int fd, struct stat* st) {
  if (g_fstat_armed.load() && stalled_path(fd)) {
    stall_until_released();
    g_returned.fetch_add(1);
    errno = EIO;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fstat, fd, st));
}

extern "C" int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                         unsigned int flags) {
  if (const int ms = g_rename_delay_ms.load(); ms > 0 && std::strstr(newpath, "stall") != nullptr)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return static_cast<int>(::syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags));
}

extern "C" int unlinkat(int dirfd, const char* path, int flags) {
  bool stalled = false;
  if (g_unlink_armed.load() && std::strstr(path, "stall") != nullptr) {
    stalled = true;
    stall_until_released();
  }
  const int r = static_cast<int>(::syscall(SYS_unlinkat, dirfd, path, flags));
  if (stalled) g_returned.fetch_add(1);
  return r;
}

namespace {

using kvtest::TempDir;

// Whether the engine would read a file below `path` after the claim (fs/memory_fs.cpp).
bool memory_only(const char* path) {
  struct statfs fs;
  struct sysinfo info;
  if (::statfs(path, &fs) != 0) return false;
  return fs.f_type == RAMFS_MAGIC ||
         (fs.f_type == TMPFS_MAGIC && ::sysinfo(&info) == 0 && info.totalswap == 0);
}

const bool g_tmpdir_moved = [] {
  const char* base = std::getenv("TMPDIR");
  if (!memory_only(base != nullptr && *base != '\0' ? base : "/tmp")) return false;
  ::setenv("TMPDIR", ".", 1);
  return true;
}();

constexpr std::size_t kBlock = 64 * 1024;
constexpr unsigned char kCanary = 0xC5;

kvtier::EngineConfig timeout_config(const TempDir& dir, unsigned readers, unsigned writers) {
  kvtier::EngineConfig c = kvtest::engine_config(dir, kvtier::ODirectMode::kOff, readers, writers);
  c.set_io_engine(kvtier::IoEngine::kPsync);  // the interposed calls are psync's
  c.set_io_timeout_s(0.3);
  return c;
}

std::string describe(const kvtier::Completion& c) {
  return "job " + std::to_string(c.job_id) + ": errno " + std::to_string(c.error.errno_value) +
         " " + c.error.operation + " " + c.error.path + ": " + c.error.message;
}

void check_timed_out(const kvtier::Completion& c, const std::string& path) {
  CHECK_MSG(!c.success, describe(c));
  CHECK_EQ(c.error.errno_value, ETIMEDOUT);
  CHECK_EQ(c.error.path, path);
  CHECK_MSG(c.error.message.find("io_timeout_s") != std::string::npos, describe(c));
}

// A valid block at `path` (stored before the stall is armed).
void put_block(kvtier::Engine& engine, kvtier::JobId id, const std::string& path,
               const std::vector<unsigned char>& bytes) {
  const kvtier::Completion c = kvtest::store(engine, id, path, "k", bytes.data(), bytes.size());
  CHECK_MSG(c.success, describe(c));
}

bool all_canary(const std::vector<unsigned char>& memory) {
  for (unsigned char b : memory)
    if (b != kCanary) return false;
  return true;
}

KV_TEST(a_stuck_load_fails_with_etimedout_and_its_memory_is_never_written) {
  TempDir dir;
  const std::string path = dir / "stall_a";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 1);
  ReleaseAtExit guard;
  std::vector<unsigned char> target(kBlock, kCanary);
  {
    kvtier::Engine engine(timeout_config(dir, 1, 1));
    put_block(engine, 1, path, bytes);
    arm();
    const kvtier::Completion c = kvtest::load(engine, 2, path, "k", target.data(), target.size());
    check_timed_out(c, path);
    CHECK_EQ(c.block_errnos.size(), std::size_t{1});
    CHECK_EQ(c.block_errnos[0], ETIMEDOUT);
    const kvtier::EngineStats s = engine.stats();
    CHECK_EQ(s.io_timeouts, std::uint64_t{1});
    CHECK_EQ(s.failed_load_jobs, std::uint64_t{1});
    CHECK_EQ(g_returned.load(), 0);  // still in the kernel when its job was reported
    CHECK_EQ(s.abandoned_ops, std::uint64_t{1});
    CHECK_EQ(s.workers_stuck, std::uint64_t{1});
    // The caller reuses the memory at once (as an engine reuses a slot).
    release();
    kvtest::wait_until([&] { return engine.stats().workers_stuck == 0; },
                       "the abandoned worker returned");
    CHECK_EQ(engine.stats().abandoned_ops, std::uint64_t{0});
    CHECK_EQ(g_returned.load(), 1);
    // The late read landed in the worker's own buffer, never in the caller's.
    CHECK(all_canary(target));
    // The block is still there and loads, on the replacement worker.
    std::vector<unsigned char> again(kBlock, 0);
    const kvtier::Completion ok = kvtest::load(engine, 3, path, "k", again.data(), again.size());
    CHECK_MSG(ok.success, describe(ok));
    CHECK(again == bytes);
  }
}

// A load whose payload CRC fails in the copy out of the worker's buffer removes its file
// under the batch's deadline (worker.cpp, run_owned): with that removal stuck in the kernel,
// the job is still reported at once, with ETIMEDOUT, and the abandoned worker removes the
// file when the kernel returns.
KV_TEST(a_checksum_failure_whose_removal_is_stuck_is_reported_by_the_deadline) {
  TempDir dir;
  const std::string path = dir / "stall_crc";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 5);
  kvtier::Engine engine(timeout_config(dir, 1, 1));
  // After the engine: a failed check releases the stall before the engine shuts down (a
  // worker stuck outside its deadline would hold the shutdown).
  ReleaseAtExit guard;
  put_block(engine, 1, path, bytes);
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    unsigned char b = 0;
    CHECK_EQ(::syscall(SYS_pread64, fd, &b, 1, 4096L + 100), 1L);
    b ^= 0x04;
    CHECK_EQ(::syscall(SYS_pwrite64, fd, &b, 1, 4096L + 100), 1L);
    ::close(fd);
  }
  arm_unlink();
  std::vector<unsigned char> target(kBlock, kCanary);
  const kvtier::Completion c = kvtest::load(engine, 2, path, "k", target.data(), target.size());
  check_timed_out(c, path);
  CHECK_EQ(g_entered.load(), 1);   // it was the removal that stuck
  CHECK_EQ(g_returned.load(), 0);  // and it had not returned when the job was reported
  CHECK(kvtest::file_exists(path));
  CHECK_EQ(engine.stats().io_timeouts, std::uint64_t{1});
  release();
  kvtest::wait_until([&] { return engine.stats().workers_stuck == 0; },
                     "the abandoned worker returned");
  CHECK_EQ(g_returned.load(), 1);
  CHECK(!kvtest::file_exists(path));  // the abandoned worker finished the removal
  const kvtier::Completion gone = kvtest::load(engine, 3, path, "k", target.data(), target.size());
  CHECK_EQ(gone.error.errno_value, ENOENT);
}

KV_TEST(a_replacement_worker_runs_the_next_jobs) {
  TempDir dir;
  const std::string stalled = dir / "stall_b";
  const std::string other = dir / "other";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 2);
  ReleaseAtExit guard;
  // One worker: whatever completes after the stall ran on a replacement.
  kvtier::Engine engine(timeout_config(dir, 1, 0));
  put_block(engine, 1, stalled, bytes);
  put_block(engine, 2, other, bytes);
  arm();
  std::vector<unsigned char> target(kBlock, kCanary);
  check_timed_out(kvtest::load(engine, 3, stalled, "k", target.data(), target.size()), stalled);
  std::vector<unsigned char> out(kBlock, 0);
  const kvtier::Completion next = kvtest::load(engine, 4, other, "k", out.data(), out.size());
  CHECK_MSG(next.success, describe(next));
  CHECK(out == bytes);
  put_block(engine, 5, dir / "another", bytes);
  const kvtier::EngineStats s = engine.stats();
  CHECK_EQ(s.workers_replaced, std::uint64_t{1});
  CHECK_EQ(s.workers_stuck, std::uint64_t{1});  // the stall is not released yet
  release();
  kvtest::wait_until([&] { return engine.stats().workers_stuck == 0; }, "stuck worker returned");
  CHECK(all_canary(target));
}

KV_TEST(replacements_stop_at_the_cap_and_resume_when_stuck_workers_return) {
  TempDir dir;
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 3);
  ReleaseAtExit guard;
  kvtier::Engine engine(timeout_config(dir, 1, 0));  // cap: 1 abandoned worker replaced
  put_block(engine, 1, dir / "stall_1", bytes);
  put_block(engine, 2, dir / "stall_2", bytes);
  put_block(engine, 3, dir / "plain", bytes);
  arm();
  std::vector<unsigned char> a(kBlock, kCanary), b(kBlock, kCanary), c(kBlock, 0);
  check_timed_out(kvtest::load(engine, 4, dir / "stall_1", "k", a.data(), a.size()),
                  dir / "stall_1");
  check_timed_out(kvtest::load(engine, 5, dir / "stall_2", "k", b.data(), b.size()),
                  dir / "stall_2");
  // Two stuck, one allowed: no worker is left, so the next job waits in the queue.
  engine.submit(6, kvtier::Direction::kLoad, {kvtest::block(dir / "plain", "k", c.data(), kBlock)});
  kvtier::EngineStats s = engine.stats();
  CHECK_EQ(s.workers_stuck, std::uint64_t{2});
  CHECK_EQ(s.workers_replaced, std::uint64_t{1});
  CHECK_EQ(s.queued_loads, std::uint64_t{1});
  release();
  std::vector<kvtier::Completion> done;
  kvtest::pop_exactly(engine, 1, done);  // a replacement ran it once a stuck worker returned
  CHECK_MSG(done[0].success, describe(done[0]));
  CHECK(c == bytes);
  // The watchdog replaces a returned worker at its next poll (50 ms), after the gauge fell.
  kvtest::wait_until(
      [&] {
        const kvtier::EngineStats now = engine.stats();
        return now.workers_stuck == 0 && now.workers_replaced == 2;
      },
      "stuck workers returned and the second one replaced");
  CHECK_EQ(engine.stats().workers_replaced, std::uint64_t{2});
  CHECK(all_canary(a) && all_canary(b));
}

KV_TEST(drain_shutdown_and_destruction_return_with_a_worker_stuck) {
  TempDir dir;
  const std::string path = dir / "stall_d";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 4);
  ReleaseAtExit guard;
  auto target = std::make_unique<std::vector<unsigned char>>(kBlock, kCanary);
  {
    kvtier::Engine engine(timeout_config(dir, 1, 1));
    put_block(engine, 1, path, bytes);
    arm();
    engine.submit(2, kvtier::Direction::kLoad,
                  {kvtest::block(path, "k", target->data(), target->size())});
    kvtest::wait_until([] { return g_entered.load() == 1; }, "the load stalled");
    std::atomic<bool> drained{false};
    std::thread drainer([&] {
      engine.drain();
      drained = true;
    });
    kvtest::wait_until([&] { return drained.load(); }, "drain() returned");
    drainer.join();
    const std::vector<kvtier::Completion> done = engine.pop_completions();
    CHECK_EQ(done.size(), std::size_t{1});
    check_timed_out(done[0], path);
    // A second stuck operation, started right before shutdown: shutdown waits for its
    // deadline, not for the kernel.
    engine.submit(3, kvtier::Direction::kLoad,
                  {kvtest::block(path, "k", target->data(), target->size())});
    kvtest::wait_until([] { return g_entered.load() == 2; }, "the second load stalled");
    engine.shutdown();
    CHECK_EQ(g_returned.load(), 0);
    const std::vector<kvtier::Completion> last = engine.pop_completions();
    CHECK_EQ(last.size(), std::size_t{1});
    check_timed_out(last[0], path);
    CHECK_EQ(engine.stats().workers_stuck, std::uint64_t{2});
  }  // the engine is destroyed while both workers are still in the kernel
  // Free the caller's memory too: a late write there would be a use after free (ASan).
  target.reset();
  release();
  kvtest::wait_until([] { return g_returned.load() == 2; }, "the stuck calls returned");
  // Give the abandoned workers time to finish with the shared state and exit (under the
  // sanitizers, a use after free or a race there fails the run).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

KV_TEST(a_stuck_store_never_reads_the_callers_memory_after_its_report) {
  TempDir dir;
  const std::string path = dir / "stall_s";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 5);
  kvtier::Engine engine(timeout_config(dir, 1, 1));
  // After the engine: a failed check releases the stall before the engine shuts down (a
  // worker stuck outside its deadline would hold the shutdown).
  ReleaseAtExit guard;
  auto source = std::make_unique<kvtest::Memory>(kBlock, 0);
  source->fill(bytes);
  arm();
  const kvtier::Completion c = kvtest::store(engine, 1, path, "k", source->data(), kBlock);
  check_timed_out(c, path);
  CHECK_EQ(engine.stats().failed_store_jobs, std::uint64_t{1});
  // The caller reuses the memory at once: the late write must read only the worker's copy
  // (the kernel's reads are invisible to the sanitizers, so the bytes themselves tell).
  std::memset(source->data(), 0xAB, kBlock);
  release();
  kvtest::wait_until([&] { return engine.stats().workers_stuck == 0; }, "stuck store returned");
  // The abandoned store went on to publish what it had copied at its start: those bytes.
  kvtest::wait_until([&] { return kvtest::file_exists(path); }, "the late store's file");
  std::vector<unsigned char> out(kBlock, 0);
  const kvtier::Completion loaded = kvtest::load(engine, 2, path, "k", out.data(), kBlock);
  CHECK_MSG(loaded.success, describe(loaded));
  CHECK(out == bytes);
}

// A directory of its own on /dev/shm and an engine on it with io_timeout_s 0.3, for the tests
// of the paths that skip the arena on a memory file system; removed at the end.
struct ShmRoot {
  std::string dir;
  ShmRoot() {
    char tmpl[] = "/dev/shm/kvtier-cpp-test.XXXXXX";
    CHECK(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~ShmRoot() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  kvtier::EngineConfig config() const {
    kvtier::EngineConfig c;
    c.set_root_dir(dir).set_o_direct(kvtier::ODirectMode::kOff).set_n_read_threads(1);
    c.set_n_write_threads(1).set_fingerprint("test-fingerprint");
    c.set_io_engine(kvtier::IoEngine::kPsync).set_io_timeout_s(0.3);
    return c;
  }
};

bool shm_is_memory() {
  (void)g_tmpdir_moved;
  if (memory_only("/dev/shm")) return true;
  std::printf("SKIP: /dev/shm is not a memory file system without swap here\n");
  return false;
}

// On a memory file system the read runs after the claim: a read stuck there (nothing on
// tmpfs waits on a device, but an interposed stall can) holds its job instead of being
// abandoned, and the job is reported only once the read returned, with its bytes. Both halves
// of the invariant show: the caller's memory is written before the report, never after.
KV_TEST(a_stuck_read_from_tmpfs_is_waited_for_never_abandoned) {
  if (!shm_is_memory()) return;
  ShmRoot root;
  const std::string path = root.dir + "/stall_m";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 9);
  kvtier::Engine engine(root.config());
  ReleaseAtExit guard;
  put_block(engine, 1, path, bytes);
  std::vector<unsigned char> target(kBlock, kCanary);
  arm();
  engine.submit(2, kvtier::Direction::kLoad,
                {kvtest::block(path, "k", target.data(), target.size())});
  kvtest::wait_until([] { return g_entered.load() == 1; }, "the read stalled");
  // Three deadlines pass with the read stuck: the watchdog leaves a claimed batch alone.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  CHECK(engine.pop_completions().empty());
  CHECK_EQ(engine.stats().io_timeouts, std::uint64_t{0});
  CHECK(all_canary(target));  // the stalled read has not reached the caller's memory yet
  release();
  std::vector<kvtier::Completion> out;
  kvtest::pop_exactly(engine, 1, out);
  CHECK_EQ(g_returned.load(), 1);  // returned before its job was reported
  CHECK_MSG(out[0].success, describe(out[0]));
  CHECK(target == bytes);
  const kvtier::EngineStats s = engine.stats();
  CHECK_EQ(s.io_timeouts, std::uint64_t{0});
  CHECK_EQ(s.memory_fs_loads, std::uint64_t{1});
}

// The opens of a load from memory run under the deadline: one stuck there is timed out and its
// job reported (and freed by pop_completions) while the open is still in the kernel. When it
// returns, failing, the worker builds the block's error from the op: from its own copy
// (OwnedPayloads::copy_ops), never from the freed job's (a heap-use-after-free that the
// sanitizer build reports).
KV_TEST(a_timed_out_open_of_a_load_from_memory_never_reads_the_reported_job) {
  if (!shm_is_memory()) return;
  ShmRoot root;
  const std::string path = root.dir + "/stall_o";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 12);
  kvtier::Engine engine(root.config());
  ReleaseAtExit guard;
  put_block(engine, 1, path, bytes);
  std::vector<unsigned char> target(kBlock, kCanary);
  arm_fstat();
  engine.submit(2, kvtier::Direction::kLoad,
                {kvtest::block(path, "k", target.data(), target.size())});
  kvtest::wait_until([] { return g_entered.load() == 1; }, "the open's fstat stalled");
  std::vector<kvtier::Completion> out;
  kvtest::pop_exactly(engine, 1, out);  // timed out, reported, and the job freed
  CHECK_EQ(out[0].block_errnos.at(0), ETIMEDOUT);
  release();
  kvtest::wait_until([] { return g_returned.load() == 1; }, "the stalled fstat returned");
  kvtest::wait_until([&] { return engine.stats().abandoned_ops == 0; },
                     "the abandoned worker to finish");
  CHECK(all_canary(target));
  // The engine goes on with a new worker.
  std::vector<unsigned char> back(kBlock, 0);
  const kvtier::Completion loaded = kvtest::load(engine, 3, path, "k", back.data(), kBlock);
  CHECK_MSG(loaded.success, describe(loaded));
  CHECK(back == bytes);
}

// The same for a store (docs/core.md, "Stores to memory"): its write into tmpfs runs after the
// claim, straight from the caller's memory, so a write stuck there holds the job, which is
// reported only after the write returned and the file was renamed into place. The rename runs
// under a fresh deadline: with what was left of the first (nothing, after the write), the
// watchdog timed it out as soon as the batch went back into the kernel, reported the job while
// the worker was still publishing from the job's op, and the job was freed under it (caught
// by AddressSanitizer in CI as a heap-use-after-free).
KV_TEST(a_stuck_write_to_tmpfs_is_waited_for_never_abandoned) {
  if (!shm_is_memory()) return;
  ShmRoot root;
  const std::string path = root.dir + "/stall_w";
  const std::vector<unsigned char> bytes = kvtest::pattern(kBlock, 11);
  kvtier::Engine engine(root.config());
  ReleaseAtExit guard;
  arm();
  engine.submit(1, kvtier::Direction::kStore,
                {kvtest::block(path, "k", const_cast<unsigned char*>(bytes.data()), kBlock)});
  kvtest::wait_until([] { return g_entered.load() == 1; }, "the write stalled");
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // three deadlines
  CHECK(engine.pop_completions().empty());
  CHECK_EQ(engine.stats().io_timeouts, std::uint64_t{0});
  CHECK(!kvtest::file_exists(path));
  g_rename_delay_ms.store(100);
  struct NoDelayAtExit {
    ~NoDelayAtExit() { g_rename_delay_ms.store(0); }
  } no_delay;
  release();
  std::vector<kvtier::Completion> out;
  kvtest::pop_exactly(engine, 1, out);
  CHECK_EQ(g_returned.load(), 1);
  CHECK_MSG(out[0].success, describe(out[0]));
  CHECK(kvtest::file_exists(path));  // published before the report
  std::vector<unsigned char> back(kBlock, 0);
  const kvtier::Completion loaded = kvtest::load(engine, 2, path, "k", back.data(), kBlock);
  CHECK_MSG(loaded.success, describe(loaded));
  CHECK(back == bytes);
  const kvtier::EngineStats s = engine.stats();
  CHECK_EQ(s.io_timeouts, std::uint64_t{0});
  CHECK_EQ(s.memory_fs_stores, std::uint64_t{1});
}

KV_TEST(io_timeout_s_is_validated) {
  TempDir dir;
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(),
                     kvtier::limits::kMaxIoTimeoutSeconds * 2}) {
    kvtier::EngineConfig c = timeout_config(dir, 1, 1);
    c.set_io_timeout_s(bad);
    CHECK_THROWS(std::invalid_argument, kvtier::Engine(c));
  }
  kvtier::EngineConfig off = timeout_config(dir, 1, 1);
  off.set_io_timeout_s(0);
  kvtier::Engine engine(off);
  CHECK_EQ(engine.config().io_timeout_s(), 0.0);
  CHECK_EQ(kvtier::EngineConfig().io_timeout_s(), 10.0);
}

}  // namespace
