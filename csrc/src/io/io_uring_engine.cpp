// Block operations on the io_uring engine: a worker's batch of blocks (one job, one direction)
// reaches the kernel in one io_uring_enter, each block as a linked chain.
//
//   store: [sync: open directory, create + OFD-lock the tmp file, dup the lock holder]
//          writev -> [fdatasync]
//          [sync: close, renameat2(RENAME_NOREPLACE), fsync directory]
//   load:  [sync: open directory, open + fstat the block file]  readv => close
//
// A store's close and rename stay off the ring because of what the kernel does with them
// (docs/PERFORMANCE.md section 9.1): ext4 and tmpfs cannot write new files without blocking
// (no async buffered writes; O_DIRECT must allocate), so the kernel hands every ring writev
// to an io-wq worker thread, and the entries linked behind it then cost this thread further
// wake-ups: 5.3 context switches per 256 KiB block with close and rename on the ring, 1.7
// with them made here after the batch's writes (psync: 0.4). For the same reason the write
// goes with RWF_NOWAIT: a write the kernel could only make by blocking comes back at once
// (EAGAIN; EOPNOTSUPP where buffered writes cannot be non-blocking, as on ext4 and tmpfs)
// instead of going to an io-wq thread, and this thread writes it (and syncs it) as psync
// does, with no hand-off at all. File systems with non-blocking buffered writes (XFS, btrfs)
// still complete it in the ring.
//
// Steps stay synchronous where a later step needs their result on this thread: the tmp file's
// lock (no io_uring opcode takes an fcntl lock, and the lock must hold before anything could
// sweep the file), and the load's fstat, which keeps FIFOs and devices from ever being read
// (io_uring would wait on a FIFO's poll instead of honouring O_NONBLOCK). So files are opened
// as ordinary descriptors, not into fixed-file slots.
//
// Payloads, as the psync path lays them out (file_iov, staged_segments):
// - Host memory that goes to the file in place (a contiguous buffer or segments, e.g. one per
//   layer) is the data step's iovec list: header page, the caller's memory, the tail page.
//   More than IOV_MAX iovecs take the psync path (one ring entry cannot carry them).
// - Staged payloads (device segments, unaligned memory under O_DIRECT) whose whole file image,
//   header page plus payload padded to a page, fits in one staging buffer go through that
//   buffer as one READ_FIXED/WRITE_FIXED: each ring registers the pool's buffers in a sparse
//   fixed-buffer table, slot = the buffer's index in the pool, as it first meets them. A store
//   gathers the segments into the buffer first (CUDA copies waited for); a load verifies the
//   header and CRC in the buffer and only then scatters. Where the kernel refuses the table
//   or a buffer (RLIMIT_MEMLOCK), the buffer goes by address (READV/WRITEV), still on the
//   ring. Larger payloads move piece by piece on the psync path, and so does a block that
//   finds no buffer free: a worker never waits for one while holding others, and gives back
//   all it holds before any block of the batch runs on the psync path (which does wait).
//
// Failures keep the psync engine's reports: a step that fails outright is reported with the
// psync step's name ("pwrite", "pread", "fdatasync", "close", "rename", "fsync"); a store's
// write that would block is made here (above); anything else psync would have retried (a
// short count, EINTR, a load's EAGAIN) or that needs verification handling (truncated or
// corrupt file) reruns the whole block through the psync code, which then decides exactly as
// the psync engine does.
#include "io/io_uring_engine.hpp"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include <kvtier/files.hpp>
#include <kvtier/format.hpp>

#include "device/segment_copier.hpp"
#include "io/block_file.hpp"
#include "io/block_header.hpp"
#include "io/posix_io.hpp"
#include "io/psync_engine.hpp"
#include "io/worker_context.hpp"

namespace kvtier::detail {
namespace {

// Which step of a block a completion belongs to: user_data = block * kSteps + step.
enum Step : unsigned { kData, kSync, kClose, kSteps };

static_assert(kMaxBatchBlocks * kSteps <= kRingEntries);

// ThreadSanitizer tracks descriptors through the close() it intercepts and cannot see a close
// the kernel does for the ring: another thread's reuse of the number looks like a race to it.
// Under TSan a load's close runs synchronously, as the io_uring engine does for a close the
// ring did not run; other builds close loaded files in the ring (stores always close here).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kRingClosesFiles = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kRingClosesFiles = false;
#else
inline constexpr bool kRingClosesFiles = true;
#endif
#else
inline constexpr bool kRingClosesFiles = true;
#endif

enum class Disposition { kDone, kQueued, kPsync };

struct Block {
  const BlockOp* op = nullptr;
  BlockResult* out = nullptr;
  const CrcPlan* crc = nullptr;  // what the caller's copy steps do about the CRC (may be null)
  Disposition how = Disposition::kDone;
  BlockFile file;  // the block's directory, descriptor and (stores) tmp file
  // In place: the host memory the iovecs cover. Staged: the segments the lease is gathered
  // from or scattered to.
  const std::vector<Segment>* payload = nullptr;
  std::vector<Segment> scratch;  // a contiguous payload as one segment
  std::vector<iovec> iov;        // the data step's iovecs (READV/WRITEV)
  std::size_t tail = 0;          // see file_iov
  const unsigned char* header = nullptr;
  // Staged: the whole file image (header, payload, zeros to a page) in one staging buffer,
  // held until its completion is reaped (and, for a load, copied out).
  bool staged = false;
  std::optional<StagingPool::Lease> lease;
  bool verified = false;      // a staged load that verified in the lease and was copied out
  StepError copy_error;       // ... or whose copy out failed
  std::size_t want = 0;       // bytes the read or write must move
  bool written_here = false;  // a store's write made by the worker (write_what_would_block)
  bool unsubmitted = false;   // the ring was given up before the kernel took all its entries
  dev_t file_dev = 0;         // a load's file, as fstat saw it (BlockResult::crc_pending)
  ino_t file_ino = 0;
  int res[kSteps] = {};
};

io_uring_sqe* next_sqe(Ring& ring, unsigned index, Step step, unsigned char opcode, int fd,
                       unsigned char flags) noexcept {
  io_uring_sqe* sqe = ring.get_sqe();  // never null: see kRingEntries
  sqe->opcode = opcode;
  sqe->fd = fd;
  sqe->flags = flags;
  sqe->user_data = index * kSteps + step;
  return sqe;
}

// Which way a block's payload goes, decided before any file is touched: in place (host
// memory, contiguous or segments, as the file's iovecs), staged (one staging buffer holds the
// whole file image), or the psync path.
Disposition route(const IoContext& ctx, Block& b) {
  const BlockOp& op = *b.op;
  const std::vector<Segment>* staged = staged_segments(op, ctx.direct, b.scratch);
  if (staged == nullptr) {
    b.payload = &in_place_payload(op, b.scratch);
    // file_iov adds the header and at most one page; one ring entry takes at most IOV_MAX
    // iovecs (the psync path splits a longer list over several calls).
    return b.payload->size() + 2 <= IOV_MAX ? Disposition::kQueued : Disposition::kPsync;
  }
  b.payload = staged;
  // The header shares the buffer (one fixed-buffer read or write per block): a payload
  // larger than a buffer less a page moves piece by piece on the psync path.
  if (kHeaderSize + align_up(op.payload_length()) > ctx.staging->buffer_size())
    return Disposition::kPsync;
  // Never waits: this worker may hold buffers for earlier blocks of the batch already, and
  // waiting for one while holding others could wait forever.
  std::optional<StagingPool::Lease> lease = ctx.staging->try_acquire();
  if (!lease) return Disposition::kPsync;
  b.lease.emplace(std::move(*lease));
  b.staged = true;
  b.header = b.lease->data();
  return Disposition::kQueued;
}

// The file's bytes as the psync engine lays them out (file_iov): header, the payload in
// place, and a last page through `tail` where O_DIRECT or a store's padding needs one. Loads
// read into the same pieces.
void lay_out(Block& b, unsigned char* header, unsigned char* tail, bool is_load) {
  b.header = header;
  b.iov = file_iov(header, tail, *b.payload, b.file.direct, !is_load, b.tail);
  b.want = 0;
  for (const iovec& v : b.iov) b.want += v.iov_len;
}

// The data step: a staged block's file image as a registered buffer (READ_FIXED/WRITE_FIXED)
// where the ring holds one for its lease, else by address; a block in place, its iovecs.
void queue_data(const IoContext& ctx, Ring& ring, Block& b, unsigned index, bool is_load,
                unsigned char flags, __kernel_rwf_t rw_flags = 0) {
  if (b.staged) {
    StagingPool::Lease& lease = *b.lease;
    b.want = kHeaderSize + align_up(b.op->payload_length());
    // Also the iovec a store's write that would block is made with (finish_store).
    b.iov.assign(1, iovec{lease.data(), b.want});
    if (ring.fixed_buffer(ctx.staging->max_buffers(), lease.index(), lease.id(), lease.data(),
                          lease.size())) {
      io_uring_sqe* sqe =
          next_sqe(ring, index, kData, is_load ? IORING_OP_READ_FIXED : IORING_OP_WRITE_FIXED,
                   b.file.fd.get(), flags);
      sqe->addr = reinterpret_cast<__u64>(lease.data());
      sqe->len = static_cast<__u32>(b.want);  // a registered buffer is at most 1 GiB
      sqe->buf_index = static_cast<__u16>(lease.index());
      sqe->rw_flags = rw_flags;
      return;
    }
  }
  io_uring_sqe* sqe = next_sqe(ring, index, kData, is_load ? IORING_OP_READV : IORING_OP_WRITEV,
                               b.file.fd.get(), flags);
  sqe->addr = reinterpret_cast<__u64>(b.iov.data());
  sqe->len = static_cast<__u32>(b.iov.size());
  sqe->rw_flags = rw_flags;
}

// Whether the header read into b.header belongs to the op and, where it carries a CRC32C,
// the payload's bytes (`crc`, called only then) match it. With `deferred` (may be null), the
// payload's CRC is not taken: the header's is left in it for the caller's copy out to check.
template <typename Crc>
bool verifies(const IoContext& ctx, const Block& b, Crc&& crc, BlockResult* deferred = nullptr) {
  const EngineSettings& config = *ctx.config;
  DecodedHeader decoded;
  if (!verify_header(b.header, b.op->key, config.fingerprint, b.op->payload_length(), decoded)
           .empty())
    return false;
  if (config.checksum != Checksum::kCrc32c || decoded.checksum_kind != kChecksumKindCrc32c)
    return true;
  if (deferred != nullptr) {
    deferred->crc_pending = true;
    deferred->expected_crc = decoded.payload_crc;
    deferred->file_dev = b.file_dev;
    deferred->file_ino = b.file_ino;
    return true;
  }
  return crc() == decoded.payload_crc;
}

// ---- store ----------------------------------------------------------------------------------

// A failed store step: the tmp file goes, as on the psync path.
void fail_store(Block& b, int error, const char* operation, std::string message = {}) {
  *b.out = b.file.fail_store(error, operation, std::move(message));
}

// A staged store's file image in its lease: the payload gathered after the header page (device
// runs copied after `ready`), zeros to the next page, and the header with the payload's CRC.
StepError fill_lease(const IoContext& ctx, WorkerContext& worker, Block& b, cuda::Event ready) {
  const EngineSettings& config = *ctx.config;
  unsigned char* image = b.lease->data();
  const std::size_t total = b.op->payload_length();
  if (StepError e = copy_staged(ctx.cuda, worker.stream, *b.payload, image + kHeaderSize, total,
                                /*to_staging=*/true, ready))
    return e;
  const std::uint32_t crc =
      config.checksum == Checksum::kCrc32c ? crc32c(image + kHeaderSize, total) : 0;
  std::memset(image + kHeaderSize + total, 0, align_up(total) - total);
  encode_header(image, b.op->key, config.fingerprint, total, config.checksum, crc);
  return {};
}

Disposition prepare_store(const IoContext& ctx, WorkerContext& worker, Ring& ring, Block& b,
                          unsigned index, unsigned char* pages, cuda::Event ready) {
  const BlockOp& op = *b.op;
  const EngineSettings& config = *ctx.config;
  if (route(ctx, b) == Disposition::kPsync) return Disposition::kPsync;
  // As on the psync path (open_tmp): no existence check first; the rename finds a block
  // already there, at the price of one wasted write for a duplicate store.
  if (!open_tmp(ctx, op, b.file, *b.out)) return Disposition::kDone;
  // `fd` is closed before the rename (a close reports deferred write errors, which must stop
  // the publish); the OFD lock lives on in this duplicate until the tmp name is gone.
  b.file.lock_holder = FileDescriptor(::fcntl(b.file.fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!b.file.lock_holder) {
    fail_store(b, errno, "dup");
    return Disposition::kDone;
  }
  if (b.staged) {
    // As write_segments: a failed copy fails the block (the tmp file goes).
    if (StepError e = fill_lease(ctx, worker, b, ready)) {
      fail_store(b, e.error, e.operation, std::move(e.message));
      return Disposition::kDone;
    }
  } else {
    std::uint32_t crc = 0;
    if (config.checksum == Checksum::kCrc32c)
      crc = b.crc != nullptr && b.crc->in_copy ? b.crc->crc : payload_crc(*b.payload);
    encode_header(pages, op.key, config.fingerprint, op.payload_length(), config.checksum, crc);
    lay_out(b, pages, pages + kHeaderSize, /*is_load=*/false);
  }

  // The last entry of a chain must not link: it would link to the next block's chain. Close,
  // rename and the directory's fsync follow in finish_store (see the top of this file).
  const bool data_sync = config.durability != Durability::kNone;
  // RWF_NOWAIT: see the top of this file.
  queue_data(ctx, ring, b, index, /*is_load=*/false, data_sync ? IOSQE_IO_LINK : 0, RWF_NOWAIT);
  if (data_sync) {
    io_uring_sqe* sqe = next_sqe(ring, index, kSync, IORING_OP_FSYNC, b.file.fd.get(), 0);
    sqe->fsync_flags = IORING_FSYNC_DATASYNC;
  }
  return Disposition::kQueued;
}

// A store's write the kernel would only have made by blocking (RWF_NOWAIT: EAGAIN, or
// EOPNOTSUPP where buffered writes cannot be non-blocking) is made here, with the fdatasync
// that was linked behind it and cancelled with it; their outcomes replace the ring's. Runs
// before the batch gives its staging buffers back: a staged block's bytes are in its lease.
void write_what_would_block(const IoContext& ctx, Block& b) noexcept {
  if (b.res[kData] != -EAGAIN && b.res[kData] != -EOPNOTSUPP) return;
  // Moved, not copied: nothing reads the iovecs after this write, and a copy could throw
  // (run_blocks, which calls this, is noexcept).
  if (int e = pwritev_full(b.file.fd.get(), std::move(b.iov), 0)) {
    b.res[kData] = -e;
    return;
  }
  b.written_here = true;
  if (ctx.config->durability != Durability::kNone)
    b.res[kSync] = ::fdatasync(b.file.fd.get()) == 0 ? 0 : -errno;
}

void finish_store(const IoContext& ctx, WorkerContext& worker, Block& b, cuda::Event ready) {
  const int* res = b.res;
  if (!b.written_here) {
    const int written = res[kData];
    if (written < 0 && written != -EINTR) return fail_store(b, -written, "pwrite");
    if (written < 0 || static_cast<std::size_t>(written) < b.want) {
      // What pwritev_full would retry: start over on the psync path with a fresh tmp file.
      b.file.discard_tmp();
      *b.out = store_block(ctx, worker, *b.op, ready, b.crc);
      b.out->o_direct_fallback |= b.file.fell_back;
      return;
    }
  }
  if (ctx.config->durability != Durability::kNone && res[kSync] < 0)
    return fail_store(b, -res[kSync], "fdatasync");
  bool vanished = false;
  *b.out = publish_tmp(ctx, *b.op, b.file, vanished);
  if (vanished) {
    // The tmp name went although the file stayed linked (see publish_tmp): the psync path
    // writes the block again under a new name.
    *b.out = store_block(ctx, worker, *b.op, ready, b.crc);
    b.out->o_direct_fallback |= b.file.fell_back;
  }
}

// ---- load -----------------------------------------------------------------------------------

Disposition prepare_load(const IoContext& ctx, Ring& ring, Block& b, unsigned index,
                         unsigned char* pages) {
  const BlockOp& op = *b.op;
  if (route(ctx, b) == Disposition::kPsync) return Disposition::kPsync;
  BlockResult& result = *b.out;
  if (!locate(ctx, op.path, /*create=*/false, b.file.loc, result)) return Disposition::kDone;
  b.file.direct = ctx.direct;
  // O_NONBLOCK and the fstat below: see load_block_impl (a FIFO must never hang a worker).
  b.file.fd = open_at(ctx, b.file.loc, b.file.loc.name,
                      O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, b.file.direct, result);
  if (!b.file.fd) return Disposition::kDone;
  b.file.fell_back = result.o_direct_fallback;
  struct stat st;
  if (::fstat(b.file.fd.get(), &st) != 0) {
    result = failure(errno, "fstat", op.path);
    return Disposition::kDone;
  }
  if (!S_ISREG(st.st_mode)) {
    result = not_regular(op.path, st.st_mode);
    return Disposition::kDone;
  }
  b.file_dev = st.st_dev;
  b.file_ino = st.st_ino;
  if (!b.staged) lay_out(b, pages, pages + kHeaderSize, /*is_load=*/true);
  // A hard link: the close runs whatever the read did, so no descriptor outlives the batch.
  queue_data(ctx, ring, b, index, /*is_load=*/true, kRingClosesFiles ? IOSQE_IO_HARDLINK : 0);
  if (kRingClosesFiles) next_sqe(ring, index, kClose, IORING_OP_CLOSE, b.file.fd.get(), 0);
  return Disposition::kQueued;
}

// A staged load once its read is reaped: the header and the payload's CRC are checked in the
// lease, and only a block that verifies is copied out (device runs after `ready`), so a wrong
// file never reaches the caller's memory. Anything else is finish_load's to decide.
void unstage_load(const IoContext& ctx, WorkerContext& worker, Block& b, cuda::Event ready) {
  const int got = b.res[kData];
  if (got < 0 || static_cast<std::size_t>(got) != b.want) return;
  const unsigned char* payload = b.lease->data() + kHeaderSize;
  const std::size_t total = b.op->payload_length();
  if (!verifies(ctx, b, [&] { return crc32c(payload, total); })) return;
  b.copy_error =
      copy_staged(ctx.cuda, worker.stream, *b.payload, b.lease->data() + kHeaderSize, total,
                  /*to_staging=*/false, ready);
  b.verified = !b.copy_error;
}

void finish_load(const IoContext& ctx, WorkerContext& worker, Block& b, cuda::Event ready) {
  const BlockOp& op = *b.op;
  // Closed by the ring unless it never ran there; a read-only close has nothing to report.
  if (b.res[kClose] != -ECANCELED) b.file.fd.release();
  b.file.fd.reset();
  const int got = b.res[kData];
  if (got < 0 && got != -EINTR && got != -EAGAIN) {
    *b.out = failure(-got, "pread", op.path);
    b.out->o_direct_fallback = b.file.fell_back;
    return;
  }
  if (b.copy_error) {  // as read_segments reports a failed copy out of staging
    *b.out = failure(b.copy_error.error, b.copy_error.operation, op.path,
                     std::move(b.copy_error.message));
    b.out->o_direct_fallback = b.file.fell_back;
    return;
  }
  bool good = b.verified;
  BlockResult verified;
  if (!b.staged && got >= 0 && static_cast<std::size_t>(got) == b.want) {
    if (b.tail > 0) {  // the partial last page, read through the tail page (see read_in_place)
      const Segment& last = *std::find_if(b.payload->rbegin(), b.payload->rend(),
                                          [](const Segment& seg) { return seg.length > 0; });
      std::memcpy(static_cast<unsigned char*>(last.address) + last.length - b.tail,
                  b.iov.back().iov_base, b.tail);
    }
    // The caller's copy out checks the payload's CRC (CrcPlan), else it is checked here.
    const bool crc_in_copy = b.crc != nullptr && b.crc->in_copy;
    good = verifies(ctx, b, [&] { return payload_crc(*b.payload); },
                    crc_in_copy ? &verified : nullptr);
  }
  if (!good) {
    // A short read, EINTR/EAGAIN or a file that does not verify: the psync path reads it again
    // and decides (a truncated or corrupt file is then removed and reported as psync does).
    *b.out = load_block(ctx, worker, op, ready, b.crc);
    b.out->o_direct_fallback |= b.file.fell_back;
    return;
  }
  *b.out = std::move(verified);
  b.out->bytes = op.payload_length();
  b.out->o_direct_fallback = b.file.fell_back;
}

// How often io_uring_enter may fail in a row with a transient error (EINTR, EAGAIN, EBUSY)
// before the ring is given up, and the pause before each retry: none for the first EINTRs (a
// signal), then 1 ms doubling up to 64 ms, about half a second in all. Completions that
// arrived are reaped before every retry (that is what makes room when the kernel is busy).
constexpr unsigned kMaxEnterFailures = 12;

void back_off(int error, unsigned failures) noexcept {
  if (error == EINTR && failures <= 3) return;
  const unsigned shift = std::min(failures, 7U) - 1;
  timespec pause{0, static_cast<long>(1'000'000L << shift)};
  while (::nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

// Waits, without io_uring_enter, until the kernel has completed every entry it consumed:
// their completions land in the CQ ring on their own (completions that need this task's
// task_work run on the return from nanosleep). Until then the entries point into this frame
// and the blocks' buffers, so this does not give up: an operation stuck in the kernel holds
// this worker exactly as a stuck pread(2) would.
unsigned wait_for_consumed(Ring& ring, Block* blocks, unsigned reaped, unsigned consumed) noexcept {
  timespec pause{0, 100'000};  // 0.1 ms, doubling up to 10 ms
  while (reaped < consumed) {
    const unsigned seen = ring.reap([&](__u64 user_data, int res) {
      blocks[user_data / kSteps].res[user_data % kSteps] = res;
    });
    reaped += seen;
    if (seen > 0 || reaped >= consumed) continue;
    ::nanosleep(&pause, nullptr);
    pause.tv_nsec = std::min(pause.tv_nsec * 2, 10'000'000L);
  }
  return reaped;
}

// Submits the queued chains and waits for every completion, filing results by user_data.
// Returns 0, or the errno for which the ring must be given up (a transient error that kept
// coming back, or any other): then every entry the kernel consumed has completed, the blocks
// with an entry it never consumed are marked `unsubmitted`, and the ring must not be entered
// again (its unconsumed entries then never run).
int complete(Ring& ring, Block* blocks, unsigned queued) noexcept {
  unsigned reaped = 0;
  unsigned failures = 0;
  while (reaped < queued) {
    const int e = ring.submit_and_wait(queued - reaped);
    reaped += ring.reap([&](__u64 user_data, int res) {
      blocks[user_data / kSteps].res[user_data % kSteps] = res;
    });
    if (e == 0) {
      failures = 0;
      continue;
    }
    if (reaped >= queued) break;  // the error came after everything completed
    if (is_transient_enter_error(e) && ++failures < kMaxEnterFailures) {
      back_off(e, failures);
      continue;
    }
    const unsigned unconsumed = ring.unconsumed();
    ring.for_each_unconsumed([&](__u64 user_data) { blocks[user_data / kSteps].unsubmitted = true; });
    wait_for_consumed(ring, blocks, reaped, queued - unconsumed);
    return e;
  }
  return 0;
}

// A block of a batch whose ring was given up before the kernel took all of its entries (the
// entries it took have completed): what prepare made is undone, and the block runs again from
// the start on the psync path (finish), as if the ring had never had it.
void unqueue(Block& b, bool is_load) noexcept {
  if (b.how != Disposition::kQueued || !b.unsubmitted) return;
  if (is_load) {
    b.file.fd.reset();
  } else {
    b.file.discard_tmp();
  }
  b.lease.reset();  // settle() would; before finish() so that psync can borrow it
  b.how = Disposition::kPsync;
}

// Prepares block `i` of a batch: its chain is queued on the ring, or it is done (failed
// before any I/O), or it goes to the psync path.
void prepare(const IoContext& ctx, WorkerContext& worker, Ring& ring, bool is_load, Block& b,
             unsigned i, cuda::Event ready) noexcept {
  for (int& r : b.res) r = -ECANCELED;  // steps that were never queued
  unsigned char* pages = worker.batch_pages.data() + i * kRingPagesPerBlock;
  try {
    b.how = is_load ? prepare_load(ctx, ring, b, i, pages)
                    : prepare_store(ctx, worker, ring, b, i, pages, ready);
  } catch (const std::bad_alloc&) {
    // Nothing is queued before the last allocation of a prepare step; a tmp file it made
    // goes (a load's descriptors close with the Block).
    if (!is_load && b.file.fd) b.file.discard_tmp();
    *b.out = unallocated_failure(ENOMEM, is_load ? "load" : "store", "out of memory");
    b.how = Disposition::kDone;
  }
}

// Once the ring's completions are in: a store's write that would have blocked is made here,
// a staged load is checked and copied out of its lease, and the lease goes back to the pool.
void settle(const IoContext& ctx, WorkerContext& worker, bool is_load, Block& b,
            cuda::Event ready) noexcept {
  if (!is_load && b.how == Disposition::kQueued) write_what_would_block(ctx, b);
  if (!b.lease) return;
  if (is_load && b.how == Disposition::kQueued) {
    try {
      unstage_load(ctx, worker, b, ready);
    } catch (const std::bad_alloc&) {
      b.copy_error.error = ENOMEM;  // reported by finish_load (the message's copy may fail)
      b.copy_error.operation = "load";
    }
  }
  b.lease.reset();
}

// A block's result: from its ring completions, or from the psync path.
void finish(const IoContext& ctx, WorkerContext& worker, bool is_load, Block& b,
            cuda::Event ready) noexcept {
  if (b.how == Disposition::kPsync) {
    *b.out = is_load ? load_block(ctx, worker, *b.op, ready, b.crc)
                     : store_block(ctx, worker, *b.op, ready, b.crc);
    return;
  }
  if (b.how != Disposition::kQueued) return;
  try {
    is_load ? finish_load(ctx, worker, b, ready) : finish_store(ctx, worker, b, ready);
  } catch (const std::bad_alloc&) {
    if (!is_load) b.file.discard_tmp();
    *b.out = unallocated_failure(ENOMEM, is_load ? "load" : "store", "out of memory");
  }
}

}  // namespace

int run_ring_batch(const IoContext& ctx, WorkerContext& worker, Ring& ring, bool is_load,
                   const BlockOp* const* ops, std::size_t n, cuda::Event ready,
                   BlockResult* results, const CrcPlan* crc) noexcept {
  Block blocks[kMaxBatchBlocks];
  for (unsigned i = 0; i < n; ++i) {
    blocks[i].op = ops[i];
    blocks[i].out = &results[i];
    blocks[i].crc = crc != nullptr ? &crc[i] : nullptr;
    prepare(ctx, worker, ring, is_load, blocks[i], i, ready);
  }
  // Each entry completes exactly once (cancelled ones too): wait for all of them.
  int retired = 0;
  if (const unsigned sqes = ring.pending()) retired = complete(ring, blocks, sqes);
  if (retired != 0) {
    for (unsigned i = 0; i < n; ++i) unqueue(blocks[i], is_load);
  }
  // Staging buffers go back before any block takes the psync path, which waits for one.
  for (unsigned i = 0; i < n; ++i) settle(ctx, worker, is_load, blocks[i], ready);
  for (unsigned i = 0; i < n; ++i) finish(ctx, worker, is_load, blocks[i], ready);
  return retired;
}

}  // namespace kvtier::detail
