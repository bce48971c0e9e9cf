// Failure handling of the io_uring engine, with faults injected at its system-call boundary:
// the submission seam (kvtier::detail::set_submit_filter) turns a chosen entry into a NOP that
// the kernel completes with the injected result (a negative errno, or a short byte count), so
// the engine sees exactly the completions a failing kernel would post, and a linked chain
// breaks as it would. Each test checks what the caller sees (errno, step, path), that no tmp
// file is left behind and that no descriptor leaks.

#include <dirent.h>
#include <linux/capability.h>
#include <linux/io_uring.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <kvtier/kvtier.hpp>

#include "engine_helpers.hpp"
#include "harness.hpp"
#include "io/block_io.hpp"
#include "io/ring.hpp"

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
  c.set_io_engine(kvtier::IoEngine::kIoUring);
  c.set_durability(durability);
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
  if (sqe.opcode == IORING_OP_WRITE_FIXED) {  // a staged block's registered buffer
    result = static_cast<int>(sqe.len);
    return true;
  }
  if (sqe.opcode != IORING_OP_FSYNC || (sqe.fsync_flags & IORING_FSYNC_DATASYNC) == 0) return false;
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
  std::atomic<int>& count = sqe.opcode == IORING_OP_WRITEV     ? s->writev
                            : sqe.opcode == IORING_OP_FSYNC    ? (datasync ? s->datasync : s->fsync)
                            : sqe.opcode == IORING_OP_CLOSE    ? s->close
                            : sqe.opcode == IORING_OP_RENAMEAT ? s->rename
                                                               : s->other;
  ++count;
  return false;
}
}  // namespace

// The ring carries a store's writev (with RWF_NOWAIT) and fdatasync only: close, rename and
// the directory's fsync, which cost io-wq hand-offs on the ring (io_uring_engine.cpp), are made
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

// ---- payloads as engines give them: segments in place, staged through registered buffers ----

namespace {

// kSegments: host memory as segments (one per layer, one of them empty) that go to the file in
// place, the iovec list over them. kStaged: unaligned memory under O_DIRECT, which moves
// through a staging buffer the ring has registered (READ_FIXED/WRITE_FIXED).
enum class Shape { kSegments, kStaged };
constexpr Shape kShapes[] = {Shape::kSegments, Shape::kStaged};

const char* name(Shape shape) {
  return shape == Shape::kSegments ? "segments" : "staged";
}

// Staging needs a file system with O_DIRECT (tmpfs has none).
bool runs_here(const TempDir& dir, Shape shape) {
  if (shape == Shape::kSegments) return true;
  const std::string why = kvtier::probe_o_direct(dir.path());
  if (!why.empty())
    std::printf("  no O_DIRECT in %s (%s): staged blocks not exercised\n", dir.path().c_str(),
                why.c_str());
  return why.empty();
}

EngineConfig shape_config(const TempDir& dir, Shape shape,
                          kvtier::Durability durability = kvtier::Durability::kNone) {
  EngineConfig c = config_for(dir, durability);
  // Segments and unaligned memory reach the I/O engine only without a deadline: with one, a
  // block's payload goes to the ring from the worker's own contiguous buffer.
  c.set_io_timeout_s(0);
  if (shape == Shape::kStaged) {
    c.set_o_direct(kvtier::ODirectMode::kOn);
    c.set_staging_buffer_bytes(32768);  // the header page and the 16 KiB padded payload fit
    c.set_staging_bytes_total(4 * c.staging_buffer_bytes());
  }
  return c;
}

// Memory for kBytes in the shape's alignment (staged: one byte past a page).
std::unique_ptr<kvtest::Memory> memory_for(Shape shape) {
  return std::make_unique<kvtest::Memory>(kBytes.size(), shape == Shape::kStaged ? 1 : 0);
}

kvtier::BlockOp shaped_block(const std::string& path, Shape shape, kvtest::Memory& memory) {
  if (shape == Shape::kStaged) return kvtest::block(path, "k", memory.data(), memory.size());
  kvtier::BlockOp op;
  op.path = path;
  op.key = "k";
  unsigned char* p = memory.data();
  op.segments = {{p, 5000, kvtier::MemoryKind::kHost},
                 {p + 5000, 0, kvtier::MemoryKind::kHost},
                 {p + 5000, memory.size() - 5000, kvtier::MemoryKind::kHost}};
  return op;
}

unsigned data_opcode(Shape shape, kvtier::Direction direction) {
  const bool load = direction == kvtier::Direction::kLoad;
  if (shape == Shape::kSegments) return load ? IORING_OP_READV : IORING_OP_WRITEV;
  return load ? IORING_OP_READ_FIXED : IORING_OP_WRITE_FIXED;
}

// Runs one block of `shape` under `fault` (checked to have hit as often as it should); no
// descriptor leaks and no tmp file stays behind.
Completion run_shaped(const TempDir& dir, Fault& fault, Shape shape, kvtier::Direction direction,
                      kvtest::Memory& memory,
                      kvtier::Durability durability = kvtier::Durability::kNone) {
  const std::size_t fds = open_fds();
  Completion c;
  {
    Inject on(fault);
    Engine engine(shape_config(dir, shape, durability));
    CHECK(engine.io_engine() == kvtier::IoEngine::kIoUring);
    c = kvtest::run_job(engine, 1, direction, {shaped_block(dir / "d/block", shape, memory)});
  }
  CHECK_EQ(fault.injected.load(), fault.times);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  CHECK_EQ(open_fds(), fds);
  return c;
}

// Aims `f` at the data step of `shape` and `direction`: `times` entries complete with `result`.
void aim(Fault& f, Shape shape, kvtier::Direction direction, int result, int times = 1) {
  f.opcode = data_opcode(shape, direction);
  f.result = result;
  f.times = times;
}

void store_shaped(const TempDir& dir, Shape shape) {
  Fault none;
  aim(none, shape, kvtier::Direction::kStore, 0, 0);
  auto src = memory_for(shape);
  src->fill(kBytes);
  const Completion c = run_shaped(dir, none, shape, kvtier::Direction::kStore, *src);
  CHECK_MSG(c.success, kvtest::describe(c));
  CHECK_EQ(none.seen.load(), 1);  // on the ring, not the psync path
}

void check_loads_back(const TempDir& dir, Shape shape) {
  Fault none;
  aim(none, shape, kvtier::Direction::kLoad, 0, 0);
  auto back = memory_for(shape);
  const Completion c = run_shaped(dir, none, shape, kvtier::Direction::kLoad, *back);
  CHECK_MSG(c.success, kvtest::describe(c));
  CHECK_EQ(none.seen.load(), 1);
  CHECK(back->equals(kBytes));
}

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Counts every submission entry by opcode, injecting nothing.
struct Opcodes {
  std::atomic<int> seen[256] = {};
};

bool count_opcodes(const io_uring_sqe& sqe, int&, void* arg) {
  static_cast<Opcodes*>(arg)->seen[sqe.opcode].fetch_add(1);
  return false;
}

}  // namespace

KV_TEST(segmented_and_staged_blocks_go_through_the_ring_byte_exact) {
  for (Shape shape : kShapes) {
    TempDir dir;
    if (!runs_here(dir, shape)) continue;
    store_shaped(dir, shape);  // checks the ring wrote it
    check_loads_back(dir, shape);
    // The file is the one the psync engine writes for the same payload.
    EngineConfig psync = kvtest::engine_config(dir, kvtier::ODirectMode::kOff, 1, 1);
    psync.set_io_engine(kvtier::IoEngine::kPsync);
    {
      Engine engine(psync);
      const Completion c =
          kvtest::store(engine, 1, dir / "d/reference", "k", kBytes.data(), kBytes.size());
      CHECK_MSG(c.success, kvtest::describe(c));
    }
    CHECK_MSG(file_bytes(dir / "d/block") == file_bytes(dir / "d/reference"), name(shape));
  }
}

KV_TEST(segmented_and_staged_write_failures_fail_the_store_and_remove_the_tmp_file) {
  for (Shape shape : kShapes) {
    for (int error : {ENOSPC, EIO}) {
      TempDir dir;
      if (!runs_here(dir, shape)) break;
      Fault f;
      aim(f, shape, kvtier::Direction::kStore, -error);
      auto src = memory_for(shape);
      src->fill(kBytes);
      check_store_failed(run_shaped(dir, f, shape, kvtier::Direction::kStore, *src), error,
                         "pwrite", dir);
    }
  }
}

KV_TEST(segmented_and_staged_short_writes_eintr_and_eagain_are_retried) {
  for (Shape shape : kShapes) {
    for (int result : {100, 0, -EINTR, -EAGAIN}) {
      TempDir dir;
      if (!runs_here(dir, shape)) break;
      Fault f;
      aim(f, shape, kvtier::Direction::kStore, result);
      auto src = memory_for(shape);
      src->fill(kBytes);
      const Completion c = run_shaped(dir, f, shape, kvtier::Direction::kStore, *src);
      CHECK_MSG(c.success, kvtest::describe(c));
      check_loads_back(dir, shape);
    }
  }
}

// As fdatasync_failure_is_reported, for a staged block (its write from a registered buffer, or
// by address where registration is refused). Close failures: test_faults.py (interposer), as
// the worker closes a store's file itself.
KV_TEST(staged_fdatasync_failure_is_reported) {
  const Shape shape = Shape::kStaged;
  TempDir dir;
  if (!runs_here(dir, shape)) return;
  Fault f;
  auto src = memory_for(shape);
  src->fill(kBytes);
  const std::size_t fds = open_fds();
  Completion c;
  {
    kvtier::detail::set_submit_filter(&datasync_fails, &f);
    Engine engine(shape_config(dir, shape, kvtier::Durability::kData));
    c = kvtest::run_job(engine, 1, kvtier::Direction::kStore,
                        {shaped_block(dir / "d/block", shape, *src)});
  }
  kvtier::detail::set_submit_filter(nullptr, nullptr);
  CHECK_EQ(f.injected.load(), 1);
  check_store_failed(c, EIO, "fdatasync", dir);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  CHECK_EQ(open_fds(), fds);
}

KV_TEST(segmented_and_staged_read_errors_are_reported_and_keep_the_file) {
  for (Shape shape : kShapes) {
    for (int error : {EIO, ENOMEM}) {
      TempDir dir;
      if (!runs_here(dir, shape)) break;
      store_shaped(dir, shape);
      Fault f;
      aim(f, shape, kvtier::Direction::kLoad, -error);
      auto back = memory_for(shape);
      const Completion c = run_shaped(dir, f, shape, kvtier::Direction::kLoad, *back);
      CHECK(!c.success);
      CHECK_EQ(c.error.errno_value, error);
      CHECK_EQ(c.error.operation, std::string("pread"));
      CHECK_EQ(c.error.path, dir / "d/block");
      CHECK(kvtest::file_exists(dir / "d/block"));
    }
  }
}

KV_TEST(segmented_and_staged_short_reads_eintr_and_eagain_are_retried) {
  for (Shape shape : kShapes) {
    for (int result : {4096, 0, -EINTR, -EAGAIN}) {
      TempDir dir;
      if (!runs_here(dir, shape)) break;
      store_shaped(dir, shape);
      Fault f;
      aim(f, shape, kvtier::Direction::kLoad, result);
      auto back = memory_for(shape);
      const Completion c = run_shaped(dir, f, shape, kvtier::Direction::kLoad, *back);
      CHECK_MSG(c.success, kvtest::describe(c));
      CHECK(back->equals(kBytes));
    }
  }
}

KV_TEST(segmented_and_staged_loads_of_damaged_files_fail_and_remove_them) {
  for (Shape shape : kShapes) {
    for (off_t at : {off_t{20}, off_t{4096 + 12000}}) {  // the header's key, the payload
      TempDir dir;
      if (!runs_here(dir, shape)) break;
      store_shaped(dir, shape);
      std::vector<unsigned char> bytes = file_bytes(dir / "d/block");
      bytes[static_cast<std::size_t>(at)] ^= 0x40;
      std::ofstream(dir / "d/block", std::ios::binary | std::ios::trunc)
          .write(reinterpret_cast<const char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size()));
      Fault none;
      aim(none, shape, kvtier::Direction::kLoad, 0, 0);
      auto back = memory_for(shape);
      const Completion c = run_shaped(dir, none, shape, kvtier::Direction::kLoad, *back);
      CHECK_MSG(!c.success && c.error.errno_value == EBADMSG &&
                    c.error.operation == std::string("verify"),
                kvtest::describe(c));
      CHECK(!kvtest::file_exists(dir / "d/block"));
    }
  }
}

KV_TEST(more_staged_blocks_than_staging_buffers_all_complete) {
  // Eight staged blocks a batch, two buffers for two writers: blocks that find none free take
  // the psync path (after the batch gave its buffers back), and nothing waits forever.
  TempDir dir;
  if (!runs_here(dir, Shape::kStaged)) return;
  EngineConfig config = shape_config(dir, Shape::kStaged);
  config.set_n_write_threads(2);
  config.set_n_read_threads(2);
  config.set_staging_bytes_total(2 * config.staging_buffer_bytes());
  Opcodes count;
  kvtier::detail::set_submit_filter(&count_opcodes, &count);
  {
    Engine engine(config);
    std::vector<std::unique_ptr<kvtest::Memory>> src, dst;
    std::vector<std::vector<unsigned char>> payloads;
    for (int job = 0; job < 4; ++job) {
      std::vector<kvtier::BlockOp> stores;
      for (int i = 0; i < 8; ++i) {
        payloads.push_back(kvtest::pattern(kBytes.size(), 100 + job * 8 + i));
        src.push_back(std::make_unique<kvtest::Memory>(kBytes.size(), 1 + i));
        src.back()->fill(payloads.back());
        stores.push_back(kvtest::block(dir / ("b/" + std::to_string(job * 8 + i)), "k",
                                       src.back()->data(), kBytes.size()));
      }
      engine.submit(static_cast<kvtier::JobId>(job), kvtier::Direction::kStore, stores);
    }
    for (const Completion& c : kvtest::drain_and_pop(engine, 4))
      CHECK_MSG(c.success, kvtest::describe(c));
    std::vector<kvtier::BlockOp> loads;
    for (int i = 0; i < 32; ++i) {
      dst.push_back(std::make_unique<kvtest::Memory>(kBytes.size(), 3));
      loads.push_back(
          kvtest::block(dir / ("b/" + std::to_string(i)), "k", dst.back()->data(), kBytes.size()));
    }
    const Completion l = kvtest::run_job(engine, 10, kvtier::Direction::kLoad, loads);
    CHECK_MSG(l.success, kvtest::describe(l));
    for (int i = 0; i < 32; ++i) CHECK(dst[i]->equals(payloads[i]));
  }
  kvtier::detail::set_submit_filter(nullptr, nullptr);
  CHECK(count.seen[IORING_OP_WRITE_FIXED].load() > 0);
  CHECK(count.seen[IORING_OP_READ_FIXED].load() > 0);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
}

KV_TEST(blocks_of_more_segments_than_iov_max_take_the_psync_path) {
  // One ring entry takes at most IOV_MAX iovecs; psync splits a longer list over several
  // calls. 1000 segments (plus header and tail page) still fit one entry, 1100 do not.
  for (std::size_t count : {std::size_t{1000}, std::size_t{1100}}) {
    TempDir dir;
    const std::vector<unsigned char> bytes = kvtest::pattern(count * 10 + 3, 21);
    std::vector<unsigned char> back(bytes.size());
    auto block = [&](unsigned char* p) {
      kvtier::BlockOp op;
      op.path = dir / "d/block";
      op.key = "k";
      for (std::size_t i = 0; i < count; ++i)
        op.segments.push_back(
            {p + i * 10, std::size_t{i + 1 < count ? 10U : 13U}, kvtier::MemoryKind::kHost});
      return op;
    };
    Opcodes count_ops;
    kvtier::detail::set_submit_filter(&count_opcodes, &count_ops);
    {
      EngineConfig config = config_for(dir);
      config.set_io_timeout_s(0);  // the caller's segments go to the I/O engine (see above)
      Engine engine(config);
      const Completion s = kvtest::run_job(engine, 1, kvtier::Direction::kStore,
                                           {block(const_cast<unsigned char*>(bytes.data()))});
      CHECK_MSG(s.success, kvtest::describe(s));
      const Completion l =
          kvtest::run_job(engine, 2, kvtier::Direction::kLoad, {block(back.data())});
      CHECK_MSG(l.success, kvtest::describe(l));
    }
    kvtier::detail::set_submit_filter(nullptr, nullptr);
    CHECK(back == bytes);
    const int on_ring = count == 1000 ? 1 : 0;
    CHECK_EQ(count_ops.seen[IORING_OP_WRITEV].load(), on_ring);
    CHECK_EQ(count_ops.seen[IORING_OP_READV].load(), on_ring);
  }
}

namespace {

// Takes CAP_IPC_LOCK out of this thread's effective set (threads started meanwhile inherit
// that) and lowers RLIMIT_MEMLOCK, so the kernel refuses to pin registered buffers (ENOMEM),
// as it does for an unprivileged user over the limit; both come back on destruction.
class NoMemlock {
 public:
  NoMemlock() {
    if (::syscall(SYS_capget, &header_, saved_) != 0 || ::getrlimit(RLIMIT_MEMLOCK, &limit_) != 0)
      return;
    __user_cap_data_struct lowered[2] = {saved_[0], saved_[1]};
    lowered[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    const rlimit tiny{64 * 1024, limit_.rlim_max};
    active_ =
        ::syscall(SYS_capset, &header_, lowered) == 0 && ::setrlimit(RLIMIT_MEMLOCK, &tiny) == 0;
  }
  ~NoMemlock() {
    ::syscall(SYS_capset, &header_, saved_);
    ::setrlimit(RLIMIT_MEMLOCK, &limit_);
  }
  NoMemlock(const NoMemlock&) = delete;
  NoMemlock& operator=(const NoMemlock&) = delete;
  bool active() const noexcept { return active_; }

 private:
  __user_cap_header_struct header_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct saved_[2] = {};
  rlimit limit_{};
  bool active_ = false;
};

}  // namespace

KV_TEST(staged_blocks_go_by_address_where_buffers_cannot_be_registered) {
  TempDir dir;
  if (!runs_here(dir, Shape::kStaged)) return;
  EngineConfig config = shape_config(dir, Shape::kStaged);
  config.set_staging_buffer_bytes(std::size_t{1} << 20);  // over the lowered limit
  config.set_staging_bytes_total(2 * config.staging_buffer_bytes());
  Opcodes count;
  auto src = memory_for(Shape::kStaged);
  auto back = memory_for(Shape::kStaged);
  src->fill(kBytes);
  {
    NoMemlock limited;
    if (!limited.active()) {
      std::printf("  cannot drop CAP_IPC_LOCK or lower RLIMIT_MEMLOCK here: not exercised\n");
      return;
    }
    kvtier::detail::set_submit_filter(&count_opcodes, &count);
    Engine engine(config);
    CHECK(engine.io_engine() == kvtier::IoEngine::kIoUring);
    const Completion s = kvtest::run_job(engine, 1, kvtier::Direction::kStore,
                                         {shaped_block(dir / "d/block", Shape::kStaged, *src)});
    CHECK_MSG(s.success, kvtest::describe(s));
    const Completion l = kvtest::run_job(engine, 2, kvtier::Direction::kLoad,
                                         {shaped_block(dir / "d/block", Shape::kStaged, *back)});
    CHECK_MSG(l.success, kvtest::describe(l));
  }
  kvtier::detail::set_submit_filter(nullptr, nullptr);
  CHECK(back->equals(kBytes));
  // Still on the ring, from the staging buffer by address.
  CHECK_EQ(count.seen[IORING_OP_WRITE_FIXED].load() + count.seen[IORING_OP_READ_FIXED].load(), 0);
  CHECK_EQ(count.seen[IORING_OP_WRITEV].load(), 1);
  CHECK_EQ(count.seen[IORING_OP_READV].load(), 1);
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
