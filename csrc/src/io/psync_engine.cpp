// The psync engine: one block at a time with pread/pwrite system calls on the worker thread.
// Also the path the io_uring engine hands a block to whenever it cannot or need not decide
// itself (io_uring_engine.cpp), so both engines report exactly the same failures.
#include "io/psync_engine.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include <kvtier/format.hpp>

#include "device/segment_copier.hpp"
#include "fs/beneath.hpp"
#include "fs/memory_fs.hpp"
#include "io/block_file.hpp"
#include "io/block_header.hpp"
#include "io/posix_io.hpp"
#include "io/worker_context.hpp"

namespace kvtier::detail {
namespace {

// ---- pieces -------------------------------------------------------------------------------

// A file that holds only memory is read or written in pieces of this size, each piece's
// CRC32C taken while it is in the core's cache: right after it lands (a load), right before
// it is written (a store). Taking the CRC of a whole large block in one pass and copying it in
// another reads every byte from memory twice (docs/PERFORMANCE.md, "Loads from memory: the
// CRC in pieces" and "Stores to memory: the CRC in pieces"). A multiple of kAlignment, so
// every piece of an O_DIRECT transfer stays aligned.
constexpr std::size_t kCrcPieceBytes = 256 * 1024;
static_assert(kCrcPieceBytes % kAlignment == 0);

// The length of the next piece when `left` bytes remain: a piece takes the rest where less
// than half a piece would be left after it, so a 256 KiB payload behind its 4 KiB header is
// one system call, not a second one for 4 KiB.
constexpr std::size_t piece_length(std::size_t left) {
  return left < kCrcPieceBytes + kCrcPieceBytes / 2 ? left : kCrcPieceBytes;
}

// A result of a piece's step that ends the walk without an error (a load's end of file).
constexpr int kStopPieces = -1;

// Walks the `count` iovecs at `iov`, which cover the file from offset `start` on, in pieces
// of piece_length(): step(piece, offset, length) for each in order, `offset` being the file
// offset the piece starts at. Stops at the first step that returns non-zero and returns that
// (0 for kStopPieces), else 0.
template <typename Step>
int for_each_piece(const iovec* iov, std::size_t count, std::size_t start, Step&& step) {
  std::size_t left = 0;
  for (std::size_t i = 0; i < count; ++i) left += iov[i].iov_len;
  std::vector<iovec> piece;
  piece.reserve(count);
  std::size_t next = 0;    // the iovec the next piece starts in,
  std::size_t within = 0;  // and how far into it
  std::size_t offset = start;
  while (next < count) {
    piece.clear();
    const std::size_t limit = piece_length(left);
    left -= limit;
    std::size_t length = 0;
    while (next < count && length < limit) {
      const std::size_t take = std::min(iov[next].iov_len - within, limit - length);
      piece.push_back({static_cast<unsigned char*>(iov[next].iov_base) + within, take});
      length += take;
      within += take;
      if (within == iov[next].iov_len) {
        ++next;
        within = 0;
      }
    }
    if (int e = step(piece, offset, length)) return e == kStopPieces ? 0 : e;
    offset += length;
  }
  return 0;
}

// `crc` extended by the bytes of `piece`, which starts at file offset `at`, that lie in the
// file range [kHeaderSize, end): the payload's bytes, neither the header nor any padding.
std::uint32_t crc_within(const std::vector<iovec>& piece, std::size_t at, std::size_t end,
                         std::uint32_t crc) {
  for (const iovec& v : piece) {
    const std::size_t lo = std::max(at, kHeaderSize);
    const std::size_t hi = std::min(at + v.iov_len, end);
    if (lo < hi) crc = crc32c(static_cast<unsigned char*>(v.iov_base) + (lo - at), hi - lo, crc);
    at += v.iov_len;
  }
  return crc;
}

// ---- store --------------------------------------------------------------------------------

void encode(const IoContext& ctx, WorkerContext& worker, const BlockOp& op, std::size_t length,
            std::uint32_t crc) {
  encode_header(worker.header.data(), op.key, ctx.config->fingerprint, length, ctx.config->checksum,
                crc);
}

// Whether a store writes its payload in checked pieces: a file that holds only memory
// (`memory_only`), a CRC to take here (not one taken in a copy already), and a payload that
// splits into more than one piece (a smaller one goes with its header in one call, as before).
bool store_by_piece(const IoContext& ctx, const BlockOp& op, const CrcPlan* plan,
                    bool memory_only) {
  return memory_only && ctx.config->checksum == Checksum::kCrc32c &&
         !(plan != nullptr && plan->in_copy) &&
         piece_length(op.payload_length()) < op.payload_length();
}

// The payload's iovecs (file_iov's, without the header) written piece by piece, each piece's
// CRC32C taken right before its write, then the header, which carries the CRC, at offset 0.
int pwrite_by_piece(const IoContext& ctx, WorkerContext& worker, int fd, const BlockOp& op,
                    const std::vector<iovec>& iov) {
  const std::size_t crc_end = kHeaderSize + op.payload_length();
  std::uint32_t crc = 0;
  const int e = for_each_piece(
      iov.data() + 1, iov.size() - 1, kHeaderSize,
      [&](const std::vector<iovec>& piece, std::size_t at, std::size_t /*length*/) {
        crc = crc_within(piece, at, crc_end, crc);
        return pwritev_full(fd, piece, static_cast<off_t>(at));
      });
  if (e != 0) return e;
  encode(ctx, worker, op, op.payload_length(), crc);
  return pwritev_full(fd, {{worker.header.data(), kHeaderSize}}, 0);
}

// Host memory in place, contiguous or segments (O_DIRECT only where in_place() allows): the
// header and the payload from the caller's memory in one vectored call, or in checked pieces
// (`by_piece`, store_by_piece); only a partial last page is copied.
StepError write_in_place(const IoContext& ctx, WorkerContext& worker, int fd, const BlockOp& op,
                         const std::vector<Segment>& payload, bool direct, const CrcPlan* plan,
                         bool by_piece) {
  std::size_t tail = 0;
  std::vector<iovec> iov =
      file_iov(worker.header.data(), worker.tail.data(), payload, direct, /*store=*/true, tail);
  if (by_piece) return {pwrite_by_piece(ctx, worker, fd, op, iov), "pwrite"};
  const bool want_crc = ctx.config->checksum == Checksum::kCrc32c;
  std::uint32_t crc = 0;
  if (want_crc) crc = plan != nullptr && plan->in_copy ? plan->crc : payload_crc(payload);
  encode(ctx, worker, op, op.payload_length(), crc);
  return {pwritev_full(fd, std::move(iov), 0), "pwrite"};
}

// Segments: gathered piece by piece into a staging buffer and written from there. The header
// needs the payload's checksum: it goes with the payload when that fits in one piece, else
// alone after the last piece.
StepError write_segments(const IoContext& ctx, WorkerContext& worker, int fd, const BlockOp& op,
                         const std::vector<Segment>& segments, cuda::Event ready) {
  // The lease outlives the copier, whose destructor retires copies still using the buffer.
  auto lease = ctx.staging->acquire();
  SegmentCopier copier(ctx.cuda, worker.stream, segments);
  if (StepError e = copier.wait_for(ready)) return e;
  const std::size_t total = op.payload_length();
  const bool want_crc = ctx.config->checksum == Checksum::kCrc32c;
  std::uint32_t crc = 0;
  for (std::size_t done = 0; done < total; done += lease.size()) {
    const std::size_t n = std::min(lease.size(), total - done);
    const std::size_t padded = align_up(n);
    if (StepError e = copier.copy(lease.data(), n, /*to_staging=*/true)) return e;
    if (want_crc) crc = crc32c(lease.data(), n, crc);
    std::memset(lease.data() + n, 0, padded - n);
    if (done == 0 && n == total) {
      encode(ctx, worker, op, total, crc);
      return {pwritev_full(fd, {{worker.header.data(), kHeaderSize}, {lease.data(), padded}}, 0),
              "pwrite"};
    }
    if (int e = pwritev_full(fd, {{lease.data(), padded}}, static_cast<off_t>(kHeaderSize + done)))
      return {e, "pwrite"};
  }
  encode(ctx, worker, op, total, crc);
  return {pwritev_full(fd, {{worker.header.data(), kHeaderSize}}, 0), "pwrite"};
}

// The header and payload into the open tmp file. A payload gathered through a staging buffer
// takes its CRC there (the plan's, if any, is the same value). `memory_only`: the tmp file
// holds only memory (RootMemory::holds), so a large payload in place goes in checked pieces.
StepError write_block(const IoContext& ctx, WorkerContext& worker, const BlockFile& file,
                      const BlockOp& op, cuda::Event ready, const CrcPlan* plan,
                      bool memory_only) {
  std::vector<Segment> scratch;
  const std::vector<Segment>* staged = staged_segments(op, file.direct, scratch);
  return staged ? write_segments(ctx, worker, file.fd.get(), op, *staged, ready)
                : write_in_place(ctx, worker, file.fd.get(), op, in_place_payload(op, scratch),
                                 file.direct, plan, store_by_piece(ctx, op, plan, memory_only));
}

// The written tmp file synced (with durability) and renamed into place.
BlockResult sync_and_publish(const IoContext& ctx, const BlockOp& op, BlockFile& file,
                             bool& vanished) {
  vanished = false;
  if (ctx.config->durability != Durability::kNone && ::fdatasync(file.fd.get()) != 0)
    return file.fail_store(errno, "fdatasync");
  return publish_tmp(ctx, op, file, vanished);
}

}  // namespace

namespace {

// Whether the open tmp file holds only memory, asked (one fstat) only where the answer
// changes how the block is written (store_by_piece) and the root's file system may be memory
// now (`root_memory_now`, RootMemory::now for the caller's batch).
bool tmp_holds_memory(const IoContext& ctx, const BlockOp& op, const CrcPlan* plan,
                      const BlockFile& file, bool root_memory_now) {
  if (!root_memory_now || !store_by_piece(ctx, op, plan, /*memory_only=*/true)) return false;
  struct stat st;
  return ::fstat(file.fd.get(), &st) == 0 && ctx.root_memory.holds(file.fd.get(), st, true);
}

BlockResult store_block_impl(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                             cuda::Event ready, const CrcPlan* plan, bool root_memory_now,
                             bool retry_vanished = true) {
  BlockResult result;
  BlockFile file;
  if (!open_tmp(ctx, op, file, result)) return result;
  // From here on every failure removes the tmp file: nothing half-written is left behind.
  const bool memory_only = tmp_holds_memory(ctx, op, plan, file, root_memory_now);
  if (StepError e = write_block(ctx, worker, file, op, ready, plan, memory_only))
    return file.fail_store(e.error, e.operation, std::move(e.message));
  bool vanished = false;
  result = sync_and_publish(ctx, op, file, vanished);
  // The tmp name went although the file was linked: write the block again under a new name,
  // once (see publish_tmp).
  if (vanished && retry_vanished)
    return store_block_impl(ctx, worker, op, ready, plan, root_memory_now,
                            /*retry_vanished=*/false);
  return result;
}

// ---- load ---------------------------------------------------------------------------------

// What reading a payload found: a failed step, a truncated file, or a header that does not
// verify (`corrupt`); else the decoded header and the payload's CRC.
struct ReadOutcome {
  StepError error;
  bool short_read = false;
  std::string corrupt;
  DecodedHeader header;
  std::uint32_t crc = 0;
};

void verify(const IoContext& ctx, WorkerContext& worker, const BlockOp& op, ReadOutcome& out) {
  out.corrupt = verify_header(worker.header.data(), op.key, ctx.config->fingerprint,
                              op.payload_length(), out.header);
}

// preadv_full of `iov` from offset 0, piece by piece; `crc` is the CRC32C of the file bytes
// in [kHeaderSize, crc_end) that were read. `got` as preadv_full's bytes_read.
int preadv_with_crc(int fd, const std::vector<iovec>& iov, std::size_t crc_end,
                    std::uint32_t& crc, std::size_t& got) {
  crc = 0;
  got = 0;
  return for_each_piece(iov.data(), iov.size(), 0,
                        [&](const std::vector<iovec>& piece, std::size_t at, std::size_t length) {
                          std::size_t n = 0;
                          if (int e = preadv_full(fd, piece, static_cast<off_t>(at), n)) return e;
                          got += n;
                          crc = crc_within(piece, at, std::min(got, crc_end), crc);
                          // End of file: the caller compares `got`.
                          return n < length ? kStopPieces : 0;
                        });
}

// Header and a host payload in place (contiguous or segments) in one vectored call; with
// O_DIRECT, which cannot read a partial page, a partial last page lands in the tail page.
// `by_piece` (a file that holds only memory): in pieces, each checked as it lands.
ReadOutcome read_in_place(const IoContext& ctx, WorkerContext& worker, int fd, bool direct,
                          const BlockOp& op, const std::vector<Segment>& payload, bool want_crc,
                          bool by_piece) {
  ReadOutcome out;
  std::size_t tail = 0;
  std::vector<iovec> iov = file_iov(worker.header.data(), worker.tail.data(), payload, direct,
                                    /*store=*/false, tail);
  const std::size_t total = op.payload_length();
  const std::size_t want = kHeaderSize + total - tail + (tail > 0 ? kAlignment : 0);
  const bool crc_by_piece = want_crc && by_piece;
  std::size_t got = 0;
  const int e = crc_by_piece ? preadv_with_crc(fd, iov, kHeaderSize + total - tail, out.crc, got)
                             : preadv_full(fd, std::move(iov), 0, got);
  if (e != 0) {
    out.error = {e, "pread"};
  } else if (got < want) {
    out.short_read = true;
  } else {
    if (tail > 0) {
      const Segment& last = *std::find_if(payload.rbegin(), payload.rend(),
                                          [](const Segment& seg) { return seg.length > 0; });
      auto* dest = static_cast<unsigned char*>(last.address) + last.length - tail;
      std::memcpy(dest, worker.tail.data(), tail);
      if (crc_by_piece) out.crc = crc32c(dest, tail, out.crc);
    }
    if (want_crc && !crc_by_piece) out.crc = payload_crc(payload);
    verify(ctx, worker, op, out);
  }
  return out;
}

// Segments through a staging buffer, piece by piece: the header and the first piece in one
// call, and the header verified before any byte reaches the segments (so a wrong file never
// does), then the other pieces.
ReadOutcome read_segments(const IoContext& ctx, WorkerContext& worker, int fd, const BlockOp& op,
                          const std::vector<Segment>& segments, bool want_crc, cuda::Event ready) {
  ReadOutcome out;
  const std::size_t total = op.payload_length();
  auto lease = ctx.staging->acquire();  // outlives the copier (see write_segments)
  const std::size_t first = align_up(std::min(lease.size(), total));
  std::size_t got = 0;
  std::vector<iovec> head{{worker.header.data(), kHeaderSize}};
  if (first > 0) head.push_back({lease.data(), first});
  if (int e = preadv_full(fd, std::move(head), 0, got)) {
    out.error = {e, "pread"};
    return out;
  }
  if (got < kHeaderSize + first) {
    out.short_read = true;
    return out;
  }
  verify(ctx, worker, op, out);
  if (!out.corrupt.empty()) return out;
  SegmentCopier copier(ctx.cuda, worker.stream, segments);
  if (StepError e = copier.wait_for(ready)) {
    out.error = std::move(e);
    return out;
  }
  for (std::size_t done = 0; done < total; done += lease.size()) {
    const std::size_t n = std::min(lease.size(), total - done);
    const std::size_t padded = align_up(n);
    if (done > 0) {
      if (int e = preadv_full(fd, {{lease.data(), padded}}, static_cast<off_t>(kHeaderSize + done),
                              got)) {
        out.error = {e, "pread"};
        return out;
      }
      if (got < padded) {
        out.short_read = true;
        return out;
      }
    }
    if (want_crc) out.crc = crc32c(lease.data(), n, out.crc);
    if (StepError e = copier.copy(lease.data(), n, /*to_staging=*/false)) {
      out.error = std::move(e);
      return out;
    }
  }
  return out;
}

// Opens a block file for reading. First in one openat2 from the root, which never follows a
// link either; a load needs no directory descriptor unless the file turns out bad. Where that
// fails (a missing block, a link, O_DIRECT refused) or openat2 is not used, the directory
// first and then the file: that route names the component in the way, falls back from
// O_DIRECT, and fills `loc`.
FileDescriptor open_for_load(const IoContext& ctx, const BlockOp& op, int flags, bool& direct,
                             Location& loc, BlockResult& result) {
  std::string directory;
  if (ctx.root->split(op.path, directory, loc.name) == 0) {
    FileDescriptor fd;
    if (ctx.root->open_file(directory, loc.name, flags | O_NOFOLLOW | (direct ? O_DIRECT : 0),
                            fd) == 0)
      return fd;
  }
  if (!locate(ctx, op.path, /*create=*/false, loc, result)) return {};
  return open_at(ctx, loc, loc.name, flags, direct, result);
}

// Removes a block file that failed verification, so the next lookup is a clean miss. Only if
// its name still leads to the file that was read: a writer may have put a good block there
// since (the old code unlinked whatever the name held).
bool remove_bad_file(const IoContext& ctx, const BlockOp& op, Location& loc, dev_t dev, ino_t ino) {
  BlockResult ignored;
  if (!loc.dir && !locate(ctx, op.path, /*create=*/false, loc, ignored)) return false;
  struct stat now;
  return ::fstatat(loc.dir.get(), loc.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
         now.st_dev == dev && now.st_ino == ino &&
         ::unlinkat(loc.dir.get(), loc.name.c_str(), 0) == 0;
}

bool open_load_impl(const IoContext& ctx, const BlockOp& op, OpenedLoad& file,
                    BlockResult& result) {
  file.direct = ctx.direct;
  // O_NONBLOCK: opening a FIFO planted at a block path must fail the block, not hang the
  // worker (and with it drain and shutdown); it changes nothing for regular files.
  file.fd = open_for_load(ctx, op, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, file.direct,
                          file.loc, result);
  if (!file.fd) return false;
  file.fell_back = result.o_direct_fallback;
  // Kept although every special file would also fail the read below (FIFOs and sockets with
  // ESPIPE, directories with EISDIR, /dev/null with a short read): reading a device planted
  // at a block path runs its driver's code, which need not honour O_NONBLOCK. One fstat, the
  // cheapest call of a load, keeps "a special file fails at once, never hangs" unconditional.
  if (::fstat(file.fd.get(), &file.st) != 0) {
    result = failure(errno, "fstat", op.path);
    return false;
  }
  if (!S_ISREG(file.st.st_mode)) {
    result = not_regular(op.path, file.st.st_mode);
    return false;
  }
  return true;
}

BlockResult read_load_impl(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                           OpenedLoad& file, cuda::Event ready, const CrcPlan* plan) {
  const EngineSettings& config = *ctx.config;
  const bool fell_back = file.fell_back;
  auto corrupt = [&](std::string why) {
    file.fd.reset();
    BlockResult r = failure(EBADMSG, "verify", op.path, std::move(why));
    r.corrupt_removed = remove_bad_file(ctx, op, file.loc, file.st.st_dev, file.st.st_ino);
    r.o_direct_fallback = fell_back;
    return r;
  };

  const bool want_crc = config.checksum == Checksum::kCrc32c;
  std::vector<Segment> scratch;
  const std::vector<Segment>* staged = staged_segments(op, file.direct, scratch);
  // The caller checks the CRC of a payload read in place while copying it out (CrcPlan); a
  // staged one is checked here before any byte leaves the staging buffer.
  const bool crc_in_copy = want_crc && staged == nullptr && plan != nullptr && plan->in_copy;
  const int fd = file.fd.get();
  ReadOutcome read = staged
                         ? read_segments(ctx, worker, fd, op, *staged, want_crc, ready)
                         : read_in_place(ctx, worker, fd, file.direct, op,
                                         in_place_payload(op, scratch), want_crc && !crc_in_copy,
                                         file.memory_only);
  if (read.error) {
    BlockResult r =
        failure(read.error.error, read.error.operation, op.path, std::move(read.error.message));
    r.o_direct_fallback = fell_back;
    return r;
  }
  if (read.short_read) return corrupt("file is truncated");
  if (!read.corrupt.empty()) return corrupt(std::move(read.corrupt));
  const bool has_crc = want_crc && read.header.checksum_kind == kChecksumKindCrc32c;
  if (has_crc && !crc_in_copy && read.crc != read.header.payload_crc)
    return corrupt("payload checksum mismatch");
  BlockResult r;
  r.bytes = op.payload_length();
  r.o_direct_fallback = fell_back;
  if (has_crc && crc_in_copy) {
    r.crc_pending = true;
    r.expected_crc = read.header.payload_crc;
    r.file_dev = file.st.st_dev;
    r.file_ino = file.st.st_ino;
  }
  return r;
}

BlockResult load_block_impl(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                            cuda::Event ready, const CrcPlan* plan, bool root_memory_now) {
  BlockResult result;
  OpenedLoad file;
  if (!open_load_impl(ctx, op, file, result)) return result;
  // Engines whose root is not memory (learnt at start) never ask per file.
  file.memory_only = ctx.root_memory.holds(file.fd.get(), file.st, root_memory_now);
  return read_load_impl(ctx, worker, op, file, ready, plan);
}

// Block operations run on worker threads, which must never unwind: anything unexpected
// (allocation failure) becomes an ordinary failed block. The handlers allocate nothing they
// cannot do without (a copy of what() is tried, and dropped if it fails).
template <typename Fn>
BlockResult guarded(const BlockOp& op, const char* operation, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return unallocated_failure(ENOMEM, operation, "out of memory");
  } catch (const std::exception& e) {
    try {
      return failure(EIO, operation, op.path, e.what());
    } catch (...) {
      return unallocated_failure(EIO, operation, "unexpected error (out of memory to say which)");
    }
  }
}

}  // namespace

BlockResult store_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        cuda::Event ready, const CrcPlan* crc, bool root_memory_now) noexcept {
  return guarded(op, "store", [&] {
    return store_block_impl(ctx, worker, op, ready, crc, root_memory_now);
  });
}

BlockResult load_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       cuda::Event ready, const CrcPlan* crc, bool root_memory_now) noexcept {
  return guarded(op, "load",
                 [&] { return load_block_impl(ctx, worker, op, ready, crc, root_memory_now); });
}

bool open_load(const IoContext& ctx, const BlockOp& op, OpenedLoad& file,
               BlockResult& result) noexcept {
  bool opened = false;
  result = guarded(op, "load", [&] {
    BlockResult r;
    opened = open_load_impl(ctx, op, file, r);
    return r;
  });
  if (!opened) file.fd.reset();
  return opened;
}

BlockResult read_load(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                      OpenedLoad& file, cuda::Event ready, const CrcPlan* crc) noexcept {
  return guarded(op, "load", [&] { return read_load_impl(ctx, worker, op, file, ready, crc); });
}

bool open_store(const IoContext& ctx, const BlockOp& op, OpenedStore& store,
                BlockResult& result) noexcept {
  bool opened = false;
  result = guarded(op, "store", [&] {
    BlockResult r;
    opened = open_tmp(ctx, op, store.file, r);
    if (opened && ::fstat(store.file.fd.get(), &store.st) != 0) {
      r = store.file.fail_store(errno, "fstat");
      opened = false;
    }
    return r;
  });
  if (!opened) store.file.discard_tmp();
  return opened;
}

BlockResult write_store(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        OpenedStore& store, cuda::Event ready) noexcept {
  BlockResult r = guarded(op, "store", [&] {
    if (StepError e = write_block(ctx, worker, store.file, op, ready, nullptr, store.memory_only))
      return store.file.fail_store(e.error, e.operation, std::move(e.message));
    return BlockResult();
  });
  if (!r.ok()) store.file.discard_tmp();  // again where an exception skipped fail_store
  return r;
}

BlockResult publish_store(const IoContext& ctx, const BlockOp& op, OpenedStore& store) noexcept {
  BlockResult r = guarded(op, "store", [&] {
    bool vanished = false;  // no second write here: the payload is not to be read again
    return sync_and_publish(ctx, op, store.file, vanished);
  });
  if (!r.ok()) store.file.discard_tmp();
  return r;
}

bool remove_corrupt_file(const IoContext& ctx, const BlockOp& op, dev_t dev, ino_t ino) {
  Location loc;
  return remove_bad_file(ctx, op, loc, dev, ino);
}

}  // namespace kvtier::detail
