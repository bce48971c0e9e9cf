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
// as ordinary descriptors, not into fixed-file slots. Payloads that need a staging buffer
// (device segments, unaligned memory under O_DIRECT) take the psync path.
//
// Failures keep the psync engine's reports: a step that fails outright is reported with the
// psync step's name ("pwrite", "pread", "fdatasync", "close", "rename", "fsync"); a store's
// write that would block is made here (above); anything else psync would have retried (a
// short count, EINTR, a load's EAGAIN) or that needs verification handling (truncated or
// corrupt file) reruns the whole block through the psync code, which then decides exactly as
// the psync engine does.

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include <kvtier/files.hpp>
#include <kvtier/format.hpp>

#include "block_io.hpp"
#include "block_steps.hpp"
#include "header.hpp"
#include "posix_io.hpp"

namespace kvtier::detail {
namespace {

// Which step of a block a completion belongs to: user_data = block * kSteps + step.
enum Step : unsigned { kData, kSync, kClose, kSteps };

// The ring holds a whole batch: every entry is reaped before the next batch is prepared.
constexpr unsigned kRingEntries = 64;
static_assert(kMaxBatchBlocks * kSteps <= kRingEntries);

// Per batch block: one header page and one tail page in the worker's batch pages.
constexpr std::size_t kPagesPerBlock = kHeaderSize + kAlignment;

enum class Disposition { kDone, kQueued, kPsync };

struct Block {
  const BlockOp* op = nullptr;
  BlockResult* out = nullptr;
  Disposition how = Disposition::kDone;
  Location loc;
  std::string tmp;
  FileDescriptor fd, lock_holder;
  bool direct = false;
  bool fell_back = false;
  iovec iov[3] = {};
  unsigned iov_count = 0;
  std::size_t want = 0;  // bytes the read or write must move
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

// The file's bytes as the psync engine lays them out (file_iov): header, the payload in
// place, and a last page through `tail` where O_DIRECT or a store's padding needs one. Loads
// read into the same pieces.
void lay_out(Block& b, unsigned char* header, unsigned char* tail, bool is_load) {
  const std::vector<Segment> payload{{b.op->data, b.op->length, MemoryKind::kHost}};
  std::size_t tail_len = 0;
  const std::vector<iovec> iov = file_iov(header, tail, payload, b.direct, !is_load, tail_len);
  b.iov_count = 0;
  b.want = 0;
  for (const iovec& v : iov) {  // at most header, payload, last page: fits b.iov
    b.iov[b.iov_count++] = v;
    b.want += v.iov_len;
  }
}

// ---- store ----------------------------------------------------------------------------------

// Drops everything a store made (the tmp file, its descriptors), as the psync path does on a
// failure. The lock holder goes last: the name is gone before the lock is released.
void discard_tmp(Block& b) noexcept {
  b.fd.reset();
  ::unlinkat(b.loc.dir.get(), b.tmp.c_str(), 0);
  b.lock_holder.reset();
}

void fail_store(Block& b, int error, const char* operation) {
  discard_tmp(b);
  *b.out = failure(error, operation, b.loc.path_of(b.tmp));
  b.out->o_direct_fallback = b.fell_back;
}

Disposition prepare_store(const IoContext& ctx, Ring& ring, Block& b, unsigned index,
                          unsigned char* pages) {
  const BlockOp& op = *b.op;
  const EngineConfig& config = *ctx.config;
  // Segmented payloads (in place or staged) and unaligned O_DIRECT buffers take the psync
  // path; the ring carries one contiguous buffer per block.
  std::vector<Segment> scratch;
  if (!op.segments.empty() || staged_segments(op, ctx.direct, scratch) != nullptr)
    return Disposition::kPsync;
  BlockResult& result = *b.out;
  if (!locate(ctx, op.path, /*create=*/true, b.loc, result)) return Disposition::kDone;
  // No existence check first: like the psync path, the rename (RENAME_NOREPLACE) finds a
  // block already there, at the price of one wasted write for a duplicate store.
  b.direct = ctx.direct;
  b.fd = create_tmp(ctx, b.loc, b.tmp, b.direct, result);
  if (!b.fd) return Disposition::kDone;
  b.fell_back = result.o_direct_fallback;
  // See store_block_impl: fchmod makes a group/other file_mode exact whatever the umask.
  if ((config.file_mode & 077) != 0 && ::fchmod(b.fd.get(), config.file_mode) != 0) {
    fail_store(b, errno, "fchmod");
    return Disposition::kDone;
  }
  // `fd` is closed before the rename (a close reports deferred write errors, which must stop
  // the publish); the OFD lock lives on in this duplicate until the tmp name is gone.
  b.lock_holder = FileDescriptor(::fcntl(b.fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!b.lock_holder) {
    fail_store(b, errno, "dup");
    return Disposition::kDone;
  }
  const std::uint32_t crc = config.checksum == Checksum::kCrc32c ? crc32c(op.data, op.length) : 0;
  unsigned char* header = pages;
  encode_header(header, op.key, config.fingerprint, op.length, config.checksum, crc);
  lay_out(b, header, pages + kHeaderSize, /*is_load=*/false);

  // The last entry of a chain must not link: it would link to the next block's chain. Close,
  // rename and the directory's fsync follow in finish_store (see the top of this file).
  const bool data_sync = config.durability != Durability::kNone;
  io_uring_sqe* sqe = next_sqe(ring, index, kData, IORING_OP_WRITEV, b.fd.get(),
                               data_sync ? IOSQE_IO_LINK : 0);
  sqe->addr = reinterpret_cast<__u64>(b.iov);
  sqe->len = b.iov_count;
  sqe->rw_flags = RWF_NOWAIT;  // see the top of this file
  if (data_sync) {
    sqe = next_sqe(ring, index, kSync, IORING_OP_FSYNC, b.fd.get(), 0);
    sqe->fsync_flags = IORING_FSYNC_DATASYNC;
  }
  return Disposition::kQueued;
}

void finish_store(const IoContext& ctx, WorkerContext& worker, Block& b, cuda::Event ready) {
  const EngineConfig& config = *ctx.config;
  const int* res = b.res;
  const int written = res[kData];
  if (written == -EAGAIN || written == -EOPNOTSUPP) {
    // The write would have blocked (RWF_NOWAIT): made here, with the fdatasync that was
    // linked behind it and cancelled with it.
    if (int e = pwritev_full(b.fd.get(), std::vector<iovec>(b.iov, b.iov + b.iov_count), 0))
      return fail_store(b, e, "pwrite");
    if (config.durability != Durability::kNone && ::fdatasync(b.fd.get()) != 0)
      return fail_store(b, errno, "fdatasync");
  } else {
    if (written < 0 && written != -EINTR) return fail_store(b, -written, "pwrite");
    if (written < 0 || static_cast<std::size_t>(written) < b.want) {
      // What pwritev_full would retry: start over on the psync path with a fresh tmp file.
      discard_tmp(b);
      *b.out = store_block(ctx, worker, *b.op, ready);
      b.out->o_direct_fallback |= b.fell_back;
      return;
    }
    if (config.durability != Durability::kNone && res[kSync] < 0)
      return fail_store(b, -res[kSync], "fdatasync");
  }
  if (int e = b.fd.close_checked()) return fail_store(b, e, "close");
  bool already_there = false;
  if (int e = publish(b.loc.dir.get(), b.tmp, b.loc.name, already_there)) {
    if (e != ENOENT) return fail_store(b, e, "rename");
    // The tmp name vanished while the file stayed linked (a sweep's unlink of an open file
    // on NFS is a silly rename): the psync path writes the block again under a new name.
    discard_tmp(b);
    *b.out = store_block(ctx, worker, *b.op, ready);
    b.out->o_direct_fallback |= b.fell_back;
    return;
  }
  if (already_there) {
    ::unlinkat(b.loc.dir.get(), b.tmp.c_str(), 0);
    struct stat st;
    if (::fstatat(b.loc.dir.get(), b.loc.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        !S_ISREG(st.st_mode)) {
      *b.out = not_regular(b.op->path, st.st_mode);
      b.out->o_direct_fallback = b.fell_back;
      b.lock_holder.reset();
      return;
    }
  }
  b.lock_holder.reset();
  if (config.durability == Durability::kFull && !already_there &&
      ::fsync(b.loc.dir.get()) != 0) {
    *b.out = failure(errno, "fsync", b.loc.dir_path);
    b.out->o_direct_fallback = b.fell_back;
    return;
  }
  *b.out = BlockResult{};
  b.out->bytes = already_there ? 0 : b.op->payload_length();  // a dedup moved no bytes
  b.out->dedup = already_there;
  b.out->o_direct_fallback = b.fell_back;
}

// ---- load -----------------------------------------------------------------------------------

Disposition prepare_load(const IoContext& ctx, Ring& ring, Block& b, unsigned index,
                         unsigned char* pages) {
  const BlockOp& op = *b.op;
  // Segmented payloads (in place or staged) and unaligned O_DIRECT buffers take the psync
  // path; the ring carries one contiguous buffer per block.
  std::vector<Segment> scratch;
  if (!op.segments.empty() || staged_segments(op, ctx.direct, scratch) != nullptr)
    return Disposition::kPsync;
  BlockResult& result = *b.out;
  if (!locate(ctx, op.path, /*create=*/false, b.loc, result)) return Disposition::kDone;
  b.direct = ctx.direct;
  // O_NONBLOCK and the fstat below: see load_block_impl (a FIFO must never hang a worker).
  b.fd = open_at(ctx, b.loc, b.loc.name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, b.direct,
                 result);
  if (!b.fd) return Disposition::kDone;
  b.fell_back = result.o_direct_fallback;
  struct stat st;
  if (::fstat(b.fd.get(), &st) != 0) {
    result = failure(errno, "fstat", op.path);
    return Disposition::kDone;
  }
  if (!S_ISREG(st.st_mode)) {
    result = not_regular(op.path, st.st_mode);
    return Disposition::kDone;
  }
  lay_out(b, pages, pages + kHeaderSize, /*is_load=*/true);
  // A hard link: the close runs whatever the read did, so no descriptor outlives the batch.
  io_uring_sqe* sqe = next_sqe(ring, index, kData, IORING_OP_READV, b.fd.get(),
                               kRingClosesFiles ? IOSQE_IO_HARDLINK : 0);
  sqe->addr = reinterpret_cast<__u64>(b.iov);
  sqe->len = b.iov_count;
  if (kRingClosesFiles) next_sqe(ring, index, kClose, IORING_OP_CLOSE, b.fd.get(), 0);
  return Disposition::kQueued;
}

void finish_load(const IoContext& ctx, WorkerContext& worker, Block& b, cuda::Event ready) {
  const EngineConfig& config = *ctx.config;
  const BlockOp& op = *b.op;
  // Closed by the ring unless it never ran there; a read-only close has nothing to report.
  if (b.res[kClose] != -ECANCELED) b.fd.release();
  b.fd.reset();
  const int got = b.res[kData];
  if (got < 0 && got != -EINTR && got != -EAGAIN) {
    *b.out = failure(-got, "pread", op.path);
    b.out->o_direct_fallback = b.fell_back;
    return;
  }
  bool good = got >= 0 && static_cast<std::size_t>(got) == b.want;
  if (good) {
    const auto* header = static_cast<const unsigned char*>(b.iov[0].iov_base);
    auto* data = static_cast<unsigned char*>(op.data);
    const std::size_t body = b.direct ? op.length / kAlignment * kAlignment : op.length;
    if (body < op.length)
      std::memcpy(data + body, b.iov[b.iov_count - 1].iov_base, op.length - body);
    DecodedHeader decoded;
    good = verify_header(header, op.key, config.fingerprint, op.payload_length(), decoded).empty();
    if (good && config.checksum == Checksum::kCrc32c &&
        decoded.checksum_kind == kChecksumKindCrc32c)
      good = crc32c(op.data, op.length) == decoded.payload_crc;
  }
  if (!good) {
    // A short read, EINTR/EAGAIN or a file that does not verify: the psync path reads it again
    // and decides (a truncated or corrupt file is then removed and reported as psync does).
    *b.out = load_block(ctx, worker, op, ready);
    b.out->o_direct_fallback |= b.fell_back;
    return;
  }
  *b.out = BlockResult{};
  b.out->bytes = op.payload_length();
  b.out->o_direct_fallback = b.fell_back;
}

// Submits the queued chains and waits for every completion, filing results by user_data.
void complete(Ring& ring, Block* blocks, unsigned queued) noexcept {
  unsigned reaped = 0;
  while (reaped < queued) {
    if (int e = ring.submit_and_wait(queued - reaped)) {
      // Entries the kernel holds point into this frame: returning would be unsafe. Only
      // impossible states get here (a bad ring descriptor or argument).
      std::fprintf(stderr, "kvtier: io_uring_enter failed: %s\n", std::strerror(e));
      std::abort();
    }
    reaped += ring.reap([&](__u64 user_data, int res) {
      blocks[user_data / kSteps].res[user_data % kSteps] = res;
    });
  }
}

}  // namespace

Ring* WorkerContext::ring() noexcept {
  if (ring_tried_ || ctx_.io_engine != IoEngine::kIoUring) return ring_.get();
  ring_tried_ = true;
  try {
    auto ring = std::make_unique<Ring>();
    if (ring->init(kRingEntries) != 0) return nullptr;
    batch_pages = AlignedBuffer(kMaxBatchBlocks * kPagesPerBlock);
    ring_ = std::move(ring);
  } catch (const std::bad_alloc&) {
  }
  return ring_.get();
}

void run_blocks(const IoContext& ctx, WorkerContext& worker, bool is_load,
                const BlockOp* const* ops, std::size_t n, cuda::Event ready,
                BlockResult* results) noexcept {
  Ring* ring = worker.ring();
  if (ring == nullptr) {
    for (std::size_t i = 0; i < n; ++i)
      results[i] = is_load ? load_block(ctx, worker, *ops[i], ready)
                           : store_block(ctx, worker, *ops[i], ready);
    return;
  }
  Block blocks[kMaxBatchBlocks];
  for (unsigned i = 0; i < n; ++i) {
    Block& b = blocks[i];
    b.op = ops[i];
    b.out = &results[i];
    for (int& r : b.res) r = -ECANCELED;  // steps that were never queued
    unsigned char* pages = worker.batch_pages.data() + i * kPagesPerBlock;
    try {
      b.how =
          is_load ? prepare_load(ctx, *ring, b, i, pages) : prepare_store(ctx, *ring, b, i, pages);
    } catch (const std::bad_alloc&) {
      // Nothing is queued before the last allocation of a prepare step; a tmp file it made
      // goes (a load's descriptors close with the Block).
      if (!is_load && b.fd) discard_tmp(b);
      results[i] = failure(ENOMEM, is_load ? "load" : "store", b.op->path, "out of memory");
      b.how = Disposition::kDone;
    }
  }
  // Each entry completes exactly once (cancelled ones too): wait for all of them.
  if (const unsigned sqes = ring->pending()) complete(*ring, blocks, sqes);
  for (unsigned i = 0; i < n; ++i) {
    Block& b = blocks[i];
    if (b.how == Disposition::kPsync) {
      results[i] =
          is_load ? load_block(ctx, worker, *b.op, ready) : store_block(ctx, worker, *b.op, ready);
    } else if (b.how == Disposition::kQueued) {
      try {
        is_load ? finish_load(ctx, worker, b, ready) : finish_store(ctx, worker, b, ready);
      } catch (const std::bad_alloc&) {
        if (!is_load) discard_tmp(b);
        results[i] = failure(ENOMEM, is_load ? "load" : "store", b.op->path, "out of memory");
      }
    }
  }
}

}  // namespace kvtier::detail
