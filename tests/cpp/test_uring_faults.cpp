// Failure handling of the io_uring engine, with faults injected at its system-call boundary:
// the submission seam (kvtier::detail::set_submit_filter) turns a chosen entry into a NOP that
// the kernel completes with the injected result (a negative errno, or a short byte count), so
// the engine sees exactly the completions a failing kernel would post, and a linked chain
// breaks as it would. Each test checks what the caller sees (errno, step, path), that no tmp
// file is left behind and that no descriptor leaks.

#include <dirent.h>
#include <linux/io_uring.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include <kvtier/kvtier.hpp>

#include "block_io.hpp"
#include "engine_helpers.hpp"
#include "harness.hpp"
#include "uring.hpp"

using kvtest::TempDir;
using kvtier::Completion;
using kvtier::Engine;
using kvtier::EngineConfig;

namespace {

// Which entries fail and how: the `skip`-th and following `times` entries with `opcode`
// (and, for fsync, the given flags) complete with `result`.
struct Fault {
  unsigned opcode = IORING_OP_NOP;
  int result = 0;
  int skip = 0;
  int times = 1;
  int fsync_flags = -1;  // -1: any
  std::atomic<int> seen{0};
  std::atomic<int> injected{0};
};

bool fault_filter(const io_uring_sqe& sqe, int& result, void* arg) {
  auto* f = static_cast<Fault*>(arg);
  if (sqe.opcode != f->opcode) return false;
  if (f->fsync_flags >= 0 && static_cast<int>(sqe.fsync_flags) != f->fsync_flags) return false;
  const int k = f->seen.fetch_add(1);
  if (k < f->skip || k >= f->skip + f->times) return false;
  f->injected.fetch_add(1);
  result = f->result;
  return true;
}

// Installs a fault for the lifetime of the guard (engines are created and destroyed inside).
class Inject {
 public:
  explicit Inject(Fault& f) { kvtier::detail::set_submit_filter(&fault_filter, &f); }
  ~Inject() { kvtier::detail::set_submit_filter(nullptr, nullptr); }
  Inject(const Inject&) = delete;
  Inject& operator=(const Inject&) = delete;
};

std::size_t open_fds() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

EngineConfig config_for(const TempDir& dir,
                        kvtier::Durability durability = kvtier::Durability::kNone) {
  EngineConfig c = kvtest::engine_config(dir, kvtier::ODirectMode::kOff, 1, 1);
  c.io_engine = kvtier::IoEngine::kIoUring;
  c.durability = durability;
  return c;
}

// Stores one block under `fault` and returns its completion; checks the engine ran io_uring,
// that nothing but (at most) the final file is left and that no descriptor leaked.
Completion store_with(const TempDir& dir, Fault& fault, const std::vector<unsigned char>& bytes,
                      kvtier::Durability durability = kvtier::Durability::kNone) {
  const std::size_t fds = open_fds();
  Completion c;
  {
    Inject on(fault);
    Engine engine(config_for(dir, durability));
    CHECK(engine.io_engine() == kvtier::IoEngine::kIoUring);
    c = kvtest::store(engine, 1, dir / "d/block", "k", bytes.data(), bytes.size());
  }
  CHECK_EQ(fault.injected.load(), fault.times);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  CHECK_EQ(open_fds(), fds);
  return c;
}

Completion load_with(const TempDir& dir, Fault& fault, std::vector<unsigned char>& back) {
  const std::size_t fds = open_fds();
  Completion c;
  {
    Inject on(fault);
    Engine engine(config_for(dir));
    c = kvtest::load(engine, 2, dir / "d/block", "k", back.data(), back.size());
  }
  CHECK_EQ(fault.injected.load(), fault.times);
  CHECK_EQ(open_fds(), fds);
  return c;
}

void store_plain(const TempDir& dir, const std::vector<unsigned char>& bytes) {
  Engine engine(config_for(dir));
  const Completion c = kvtest::store(engine, 1, dir / "d/block", "k", bytes.data(), bytes.size());
  CHECK_MSG(c.success, kvtest::describe(c));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_store_failed(const Completion& c, int error, const std::string& operation,
                        const TempDir& dir) {
  CHECK_MSG(!c.success && c.error.errno_value == error && c.error.operation == operation,
            kvtest::describe(c));
  CHECK_MSG(ends_with(c.error.path, ".tmp") || operation == "fsync", c.error.path);
  CHECK(!kvtest::file_exists(dir / "d/block"));
}

const std::vector<unsigned char> kBytes = kvtest::pattern(3 * 4096 + 100, 7);

// Loads the block under `fault` and checks that it arrives byte-exact.
void check_loads_back(const TempDir& dir, Fault& fault) {
  std::vector<unsigned char> back(kBytes.size());
  const Completion c = load_with(dir, fault, back);
  CHECK_MSG(c.success, kvtest::describe(c));
  CHECK(back == kBytes);
}

}  // namespace

KV_TEST(write_enospc_and_eio_fail_the_store_and_remove_the_tmp_file) {
  for (int error : {ENOSPC, EIO}) {
    TempDir dir;
    Fault f;
    f.opcode = IORING_OP_WRITEV;
    f.result = -error;
    check_store_failed(store_with(dir, f, kBytes), error, "pwrite", dir);
  }
}

KV_TEST(short_write_eintr_and_eagain_are_retried) {
  for (int result : {100, 0, -EINTR, -EAGAIN}) {
    TempDir dir;
    Fault f;
    f.opcode = IORING_OP_WRITEV;
    f.result = result;
    const Completion c = store_with(dir, f, kBytes);
    CHECK_MSG(c.success, kvtest::describe(c));
    Fault none;
    none.times = 0;
    check_loads_back(dir, none);
  }
}

namespace {
// The ring's fdatasync runs only behind a write the ring made: where the file system cannot
// write without blocking, the RWF_NOWAIT write comes back and cancels it (the worker then
// syncs, out of this seam's sight). So the write is reported made, in full, and the
// fdatasync behind it fails.
bool datasync_fails(const io_uring_sqe& sqe, int& result, void* arg) {
  if (sqe.opcode == IORING_OP_WRITEV) {
    const auto* iov = reinterpret_cast<const iovec*>(sqe.addr);
    result = 0;
    for (unsigned i = 0; i < sqe.len; ++i) result += static_cast<int>(iov[i].iov_len);
    return true;
  }
  if (sqe.opcode != IORING_OP_FSYNC || (sqe.fsync_flags & IORING_FSYNC_DATASYNC) == 0)
    return false;
  static_cast<Fault*>(arg)->injected.fetch_add(1);
  result = -EIO;
  return true;
}
}  // namespace

KV_TEST(fdatasync_failure_is_reported) {
  TempDir dir;
  Fault f;
  const std::size_t fds = open_fds();
  Completion c;
  {
    kvtier::detail::set_submit_filter(&datasync_fails, &f);
    Engine engine(config_for(dir, kvtier::Durability::kData));
    c = kvtest::store(engine, 1, dir / "d/block", "k", kBytes.data(), kBytes.size());
  }
  kvtier::detail::set_submit_filter(nullptr, nullptr);
  CHECK_EQ(f.injected.load(), 1);
  check_store_failed(c, EIO, "fdatasync", dir);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  CHECK_EQ(open_fds(), fds);
}

namespace {
// Records the opcode (and, for fsync, the flags) of every entry submitted; injects nothing.
struct Submitted {
  std::atomic<int> writev{0}, datasync{0}, fsync{0}, close{0}, rename{0}, other{0};
  std::atomic<int> nowait_writev{0};
};

bool record_filter(const io_uring_sqe& sqe, int&, void* arg) {
  auto* s = static_cast<Submitted*>(arg);
  if (sqe.opcode == IORING_OP_WRITEV && (sqe.rw_flags & RWF_NOWAIT) != 0) ++s->nowait_writev;
  const bool datasync = (sqe.fsync_flags & IORING_FSYNC_DATASYNC) != 0;
  std::atomic<int>& count = sqe.opcode == IORING_OP_WRITEV   ? s->writev
                            : sqe.opcode == IORING_OP_FSYNC  ? (datasync ? s->datasync : s->fsync)
                            : sqe.opcode == IORING_OP_CLOSE  ? s->close
                            : sqe.opcode == IORING_OP_RENAMEAT ? s->rename
                                                               : s->other;
  ++count;
  return false;
}
}  // namespace

// The ring carries a store's writev (with RWF_NOWAIT) and fdatasync only: close, rename and
// the directory's fsync, which cost io-wq hand-offs on the ring (block_io_uring.cpp), are made
// by the worker after the batch's writes. Their failures are tested through the LD_PRELOAD
// interposer on both engines (tests/python/test_faults.py).
KV_TEST(a_store_puts_only_its_write_and_data_sync_on_the_ring) {
  TempDir dir;
  Submitted seen;
  kvtier::detail::set_submit_filter(&record_filter, &seen);
  Completion c;
  {
    Engine engine(config_for(dir, kvtier::Durability::kFull));
    CHECK(engine.io_engine() == kvtier::IoEngine::kIoUring);
    c = kvtest::store(engine, 1, dir / "d/block", "k", kBytes.data(), kBytes.size());
  }
  kvtier::detail::set_submit_filter(nullptr, nullptr);
  CHECK_MSG(c.success, kvtest::describe(c));
  CHECK(kvtest::file_exists(dir / "d/block"));
  CHECK_EQ(seen.writev.load(), 1);
  CHECK_EQ(seen.nowait_writev.load(), 1);
  CHECK_EQ(seen.datasync.load(), 1);
  CHECK_EQ(seen.fsync.load(), 0);
  CHECK_EQ(seen.close.load(), 0);
  CHECK_EQ(seen.rename.load(), 0);
  CHECK_EQ(seen.other.load(), 0);
}

// A write the kernel could only make by blocking comes back from RWF_NOWAIT with EAGAIN, or
// EOPNOTSUPP where buffered writes cannot be non-blocking (ext4, tmpfs): the worker writes the
// block and makes the fdatasync that was cancelled with it; the block arrives whole.
KV_TEST(a_write_that_would_block_is_made_by_the_worker) {
  for (int error : {EAGAIN, EOPNOTSUPP}) {
    for (auto durability : {kvtier::Durability::kNone, kvtier::Durability::kData}) {
      TempDir dir;
      Fault f;
      f.opcode = IORING_OP_WRITEV;
      f.result = -error;
      const Completion c = store_with(dir, f, kBytes, durability);
      CHECK_MSG(c.success, kvtest::describe(c));
      Fault none;
      none.times = 0;
      check_loads_back(dir, none);
    }
  }
}

KV_TEST(storing_onto_an_existing_file_is_a_dedup) {
  TempDir dir;
  store_plain(dir, kBytes);
  Fault none;
  none.times = 0;
  const Completion c = store_with(dir, none, kBytes);
  CHECK_MSG(c.success, kvtest::describe(c));
}

KV_TEST(read_errors_are_reported_and_keep_the_file) {
  for (int error : {EIO, ENOMEM}) {
    TempDir dir;
    store_plain(dir, kBytes);
    Fault f;
    f.opcode = IORING_OP_READV;
    f.result = -error;
    std::vector<unsigned char> back(kBytes.size());
    const Completion c = load_with(dir, f, back);
    CHECK(!c.success);
    CHECK_EQ(c.error.errno_value, error);
    CHECK_EQ(c.error.operation, std::string("pread"));
    CHECK_EQ(c.error.path, dir / "d/block");
    CHECK(kvtest::file_exists(dir / "d/block"));
  }
}

KV_TEST(short_read_eintr_and_eagain_are_retried) {
  for (int result : {4096, 0, -EINTR, -EAGAIN}) {
    TempDir dir;
    store_plain(dir, kBytes);
    Fault f;
    f.opcode = IORING_OP_READV;
    f.result = result;
    check_loads_back(dir, f);
  }
}

KV_TEST(a_failed_block_does_not_disturb_the_rest_of_its_batch) {
  // Eight small blocks of one job go to the kernel in one submission; the third write fails.
  TempDir dir;
  Fault f;
  f.opcode = IORING_OP_WRITEV;
  f.result = -ENOSPC;
  f.skip = 2;
  const std::size_t fds = open_fds();
  {
    Inject on(f);
    Engine engine(config_for(dir));
    std::vector<kvtier::BlockOp> ops;
    for (int i = 0; i < 8; ++i)
      ops.push_back(kvtest::block(dir / ("b/" + std::to_string(i)), "k",
                                  const_cast<unsigned char*>(kBytes.data()), kBytes.size()));
    const Completion c = kvtest::run_job(engine, 1, kvtier::Direction::kStore, ops);
    CHECK(!c.success);
    int failed = 0;
    for (std::size_t i = 0; i < c.block_errnos.size(); ++i) {
      if (c.block_errnos[i] == 0) {
        CHECK(kvtest::file_exists(dir / ("b/" + std::to_string(i))));
      } else {
        CHECK_EQ(c.block_errnos[i], ENOSPC);
        ++failed;
      }
    }
    CHECK_EQ(failed, 1);
  }
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  CHECK_EQ(open_fds(), fds);
}

namespace {
// The seam needs IORING_NOP_INJECT_RESULT (Linux 6.10): without it these tests cannot inject.
struct RequireInjection {
  RequireInjection() {
    if (!kvtier::detail::nop_injection_supported()) {
      std::printf("SKIP: this kernel cannot inject NOP results (IORING_NOP_INJECT_RESULT)\n");
      std::exit(77);
    }
  }
} require_injection;
}  // namespace
