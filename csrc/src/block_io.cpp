#include "block_io.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include <kvtier/files.hpp>
#include <kvtier/format.hpp>

#include "beneath.hpp"
#include "block_steps.hpp"
#include "header.hpp"
#include "posix_io.hpp"

namespace kvtier::detail {
namespace {

alignas(kAlignment) const unsigned char kZeroPage[kAlignment] = {};

bool is_aligned(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % kAlignment == 0;
}

// Whether host segments can be the file's iovecs themselves: always with buffered I/O; with
// O_DIRECT when every segment starts on a page and all but the last are whole pages (the
// last one's partial page goes through the worker's tail page). Device memory never can.
bool in_place(const std::vector<Segment>& segments, bool direct) {
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    if (seg.kind != MemoryKind::kHost) return false;
    if (direct && seg.length > 0 &&
        (!is_aligned(seg.address) || (i + 1 < segments.size() && seg.length % kAlignment != 0)))
      return false;
  }
  return true;
}

}  // namespace

// Payloads that cannot go to the file in place move through a staging buffer as segments:
// the op's own segments when they hold device memory or, with O_DIRECT, unaligned host
// memory; or its contiguous buffer as one host segment when O_DIRECT meets unaligned memory.
// Returns nullptr when the payload goes in place (see in_place_payload()).
const std::vector<Segment>* staged_segments(const BlockOp& op, bool direct,
                                            std::vector<Segment>& scratch) {
  if (!op.segments.empty()) return in_place(op.segments, direct) ? nullptr : &op.segments;
  if (!direct || is_aligned(op.data) || op.length == 0) return nullptr;
  scratch = {{op.data, op.length, MemoryKind::kHost}};
  return &scratch;
}

const std::vector<Segment>& in_place_payload(const BlockOp& op, std::vector<Segment>& scratch) {
  if (!op.segments.empty()) return op.segments;
  scratch = {{op.data, op.length, MemoryKind::kHost}};
  return scratch;
}

std::vector<iovec> file_iov(unsigned char* header, unsigned char* tail_page,
                            const std::vector<Segment>& payload, bool direct, bool store,
                            std::size_t& tail) {
  std::vector<iovec> iov;
  iov.reserve(payload.size() + 2);
  iov.push_back({header, kHeaderSize});
  std::size_t total = 0;
  for (const Segment& seg : payload) {
    if (seg.length == 0) continue;
    iov.push_back({seg.address, seg.length});
    total += seg.length;
  }
  tail = 0;
  const std::size_t rest = total % kAlignment;
  if (rest == 0) return iov;
  if (direct) {
    tail = rest;  // in_place(): all of it lies at the end of the last segment
    iovec& last = iov.back();
    last.iov_len -= rest;
    const auto* cut = static_cast<unsigned char*>(last.iov_base) + last.iov_len;
    if (store) {
      std::memcpy(tail_page, cut, rest);
      std::memset(tail_page + rest, 0, kAlignment - rest);
    }
    if (last.iov_len == 0) iov.pop_back();
    iov.push_back({tail_page, kAlignment});
  } else if (store) {
    iov.push_back({const_cast<unsigned char*>(kZeroPage), kAlignment - rest});
  }
  return iov;
}

std::uint32_t payload_crc(const std::vector<Segment>& payload) {
  std::uint32_t crc = 0;
  for (const Segment& seg : payload)
    if (seg.length > 0) crc = crc32c(seg.address, seg.length, crc);
  return crc;
}

BlockResult failure(int error, const char* operation, const std::string& path,
                    std::string message) {
  BlockResult r;
  r.error = error;
  r.operation = operation;
  r.path = path;
  r.message = std::move(message);
  return r;
}

namespace {

StepError cuda_failure(const cuda::Api& api, cuda::Error e, const char* operation) {
  // CUDA errors have no errno; EIO marks them as I/O failures, the message names them.
  return {EIO, operation, cuda::describe(api, e)};
}

// ---- payload as segments: gathered into / scattered from a staging buffer ----------------

// Walks a block's segments piece by piece, copying between them and a staging buffer.
// Host runs are memcpy'd; device runs become one batched CUDA copy (or one copy per run on
// runtimes without the batch call), followed by one stream synchronisation per piece.
class SegmentCopier {
 public:
  SegmentCopier(const IoContext& ctx, WorkerContext& worker, const std::vector<Segment>& segments)
      : ctx_(ctx), worker_(worker), segments_(segments) {}
  // Work left on the stream after a failure (copies queued before the failing call, a wait on
  // the submitter's event) must retire before the staging buffer is reused and the job's
  // event is destroyed.
  ~SegmentCopier() {
    if (!unsynchronized_) return;
    cuda::Stream stream = nullptr;
    if (worker_.stream(stream) == cuda::kSuccess) ctx_.cuda->cudaStreamSynchronize(stream);
    ctx_.cuda->cudaGetLastError();
  }
  SegmentCopier(const SegmentCopier&) = delete;
  SegmentCopier& operator=(const SegmentCopier&) = delete;

  // Copies the next `n` payload bytes between the segments and `staging`.
  StepError copy(unsigned char* staging, std::size_t n, bool to_staging) {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    std::size_t done = 0;
    while (done < n) {
      const Segment& seg = segments_[index_];
      const std::size_t take = std::min(seg.length - offset_, n - done);
      auto* mem = static_cast<unsigned char*>(seg.address) + offset_;
      unsigned char* stage = staging + done;
      if (seg.kind == MemoryKind::kHost) {
        if (to_staging)
          std::memcpy(stage, mem, take);
        else
          std::memcpy(mem, stage, take);
      } else {
        dsts_.push_back(to_staging ? static_cast<void*>(stage) : mem);
        srcs_.push_back(to_staging ? static_cast<const void*>(mem) : stage);
        sizes_.push_back(take);
      }
      done += take;
      offset_ += take;
      if (offset_ == seg.length) {
        ++index_;
        offset_ = 0;
      }
    }
    return dsts_.empty() ? StepError{} : copy_device(to_staging);
  }

  // Makes the worker's stream wait for the submitter's event (jobs over device memory): the
  // copies queued after this start once the caller's stream has reached the event.
  StepError wait_for(cuda::Event ready) {
    if (ready == nullptr || ctx_.cuda == nullptr) return {};
    cuda::Stream stream = nullptr;
    if (cuda::Error e = worker_.stream(stream))
      return cuda_failure(*ctx_.cuda, e, "cudaStreamCreate");
    if (cuda::Error e = ctx_.cuda->cudaStreamWaitEvent(stream, ready, 0))
      return cuda_failure(*ctx_.cuda, e, "cudaStreamWaitEvent");
    unsynchronized_ = true;
    return {};
  }

 private:
  StepError copy_device(bool to_staging) {
    const cuda::Api& api = *ctx_.cuda;
    cuda::Stream stream = nullptr;
    if (cuda::Error e = worker_.stream(stream)) return cuda_failure(api, e, "cudaStreamCreate");
    const cuda::MemcpyKind kind = to_staging ? cuda::kDeviceToHost : cuda::kHostToDevice;
    cuda::Error e = cuda::kSuccess;
    unsynchronized_ = true;
    if (sizes_.size() > 1 && (api.batch_copy_13 || api.batch_copy_12)) {
      cuda::MemcpyAttributes attrs{};
      attrs.src_access_order = cuda::kSrcAccessOrderStream;
      std::size_t attrs_index = 0;
      if (api.batch_copy_13) {
        e = api.batch_copy_13(dsts_.data(), srcs_.data(), sizes_.data(), sizes_.size(), &attrs,
                              &attrs_index, 1, stream);
      } else {
        std::size_t fail_index = 0;
        e = api.batch_copy_12(dsts_.data(), srcs_.data(), sizes_.data(), sizes_.size(), &attrs,
                              &attrs_index, 1, &fail_index, stream);
      }
      if (e != cuda::kSuccess) return cuda_failure(api, e, "cudaMemcpyBatchAsync");
    } else {
      for (std::size_t i = 0; i < sizes_.size(); ++i) {
        e = api.cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], kind, stream);
        if (e != cuda::kSuccess) return cuda_failure(api, e, "cudaMemcpyAsync");
      }
    }
    // The staging buffer is reused (or written to disk) next: the copies must be done.
    if ((e = api.cudaStreamSynchronize(stream)) != cuda::kSuccess)
      return cuda_failure(api, e, "cudaStreamSynchronize");
    unsynchronized_ = false;
    return {};
  }

  const IoContext& ctx_;
  WorkerContext& worker_;
  const std::vector<Segment>& segments_;
  std::size_t index_ = 0, offset_ = 0;
  bool unsynchronized_ = false;  // work queued on the worker's stream since the last sync
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<std::size_t> sizes_;
};

}  // namespace

StepError copy_staged(const IoContext& ctx, WorkerContext& worker,
                      const std::vector<Segment>& segments, unsigned char* staging, std::size_t n,
                      bool to_staging, cuda::Event ready) {
  SegmentCopier copier(ctx, worker, segments);
  if (StepError e = copier.wait_for(ready)) return e;
  return copier.copy(staging, n, to_staging);
}

// ---- opening ------------------------------------------------------------------------------

bool locate(const IoContext& ctx, const std::string& path, bool create, Location& out,
            BlockResult& result) {
  std::string directory;
  if (ctx.root->split(path, directory, out.name) != 0) {
    result =
        failure(EPERM, "resolve", path, "block path is not below root_dir " + ctx.root->path());
    return false;
  }
  if (PathError e = ctx.root->open_directory(directory, create, ctx.directory_mode, out.dir)) {
    // A missing directory is a missing block; anything else names the entry in the way.
    if (e.error == ENOENT) {
      result = failure(ENOENT, "open", path);
    } else {
      result = failure(e.error, e.operation, e.path,
                       e.error == ELOOP || e.error == EXDEV || e.error == ENOTDIR
                           ? "not a directory of the tier; links below root_dir are never followed"
                           : "");
    }
    return false;
  }
  out.dir_path = ctx.root->absolute(directory);
  return true;
}

BlockResult not_regular(const std::string& path, mode_t mode) {
  return failure(not_regular_error(mode), "open", path,
                 std::string("found ") + file_kind(mode) + " where a block file belongs");
}

// Opens `name` in `dir`, never through a link. Falls back from O_DIRECT to buffered I/O when
// the file system refuses it (EINVAL) and the mode allows.
FileDescriptor open_at(const IoContext& ctx, const Location& loc, const std::string& name,
                       int flags, bool& direct, BlockResult& result) {
  for (;;) {
    int fd = ::openat(loc.dir.get(), name.c_str(), flags | O_NOFOLLOW | (direct ? O_DIRECT : 0),
                      ctx.config->file_mode);
    if (fd >= 0) return FileDescriptor(fd);
    const int error = errno;
    if (error == EINTR) continue;
    // Some file systems (ramfs, FUSE clients) create the file and only then refuse O_DIRECT.
    // The name is this writer's own (O_EXCL, unique), so what is there is what the failed
    // call made: remove it, or the buffered retry would meet EEXIST (and a failure would
    // leave it behind).
    if (error == EINVAL && direct && (flags & O_CREAT)) ::unlinkat(loc.dir.get(), name.c_str(), 0);
    if (error == EINVAL && direct && ctx.config->o_direct == ODirectMode::kAuto) {
      direct = false;
      result.o_direct_fallback = true;
      continue;
    }
    result = failure(error, "open", loc.path_of(name),
                     error == ELOOP ? "found a symbolic link where a block file belongs; links "
                                      "below root_dir are never followed"
                                    : "");
    return {};
  }
}

namespace {

// ---- store --------------------------------------------------------------------------------

void encode(const IoContext& ctx, WorkerContext& worker, const BlockOp& op, std::size_t length,
            std::uint32_t crc) {
  encode_header(worker.header.data(), op.key, ctx.config->fingerprint, length, ctx.config->checksum,
                crc);
}

// Host memory in place, contiguous or segments (O_DIRECT only where in_place() allows): the
// header and the payload from the caller's memory in one vectored call; only a partial last
// page is copied.
StepError write_in_place(const IoContext& ctx, WorkerContext& worker, int fd, const BlockOp& op,
                         const std::vector<Segment>& payload, bool direct) {
  const bool want_crc = ctx.config->checksum == Checksum::kCrc32c;
  encode(ctx, worker, op, op.payload_length(), want_crc ? payload_crc(payload) : 0);
  std::size_t tail = 0;
  std::vector<iovec> iov =
      file_iov(worker.header.data(), worker.tail.data(), payload, direct, /*store=*/true, tail);
  return {pwritev_full(fd, std::move(iov), 0), "pwrite"};
}

// Segments: gathered piece by piece into a staging buffer and written from there. The header
// needs the payload's checksum: it goes with the payload when that fits in one piece, else
// alone after the last piece.
StepError write_segments(const IoContext& ctx, WorkerContext& worker, int fd, const BlockOp& op,
                         const std::vector<Segment>& segments, cuda::Event ready) {
  // The lease outlives the copier, whose destructor retires copies still using the buffer.
  auto lease = ctx.staging->acquire();
  SegmentCopier copier(ctx, worker, segments);
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

}  // namespace

// Renames without replacing an existing file, so the first writer of a key wins and later
// ones become dedups: this is the store's only existence check. File systems without
// RENAME_NOREPLACE (NFS) fall back to a look, then rename(): whatever is at the final name
// (a block, or a FIFO planted there) is kept, and only an equal block written in the window
// between the look and the rename can be replaced. Both names are in `dir`: no path is
// re-resolved.
int publish(int dir, const std::string& tmp, const std::string& final_name, bool& already_there) {
  already_there = false;
#ifdef RENAME_NOREPLACE
  if (::renameat2(dir, tmp.c_str(), dir, final_name.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno == EEXIST) {
    already_there = true;
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
#endif
  struct stat st;
  if (::fstatat(dir, final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    already_there = true;
    return 0;
  }
  return ::renameat(dir, tmp.c_str(), dir, final_name.c_str()) == 0 ? 0 : errno;
}

// Creates and locks this writer's tmp file. The lock tells a start-up sweep in any process
// (any PID namespace) that the writer is alive; a sweep that looked in the instant between
// create and lock may have removed the file, which the writer sees and answers with a new
// name. One fstat tells: the tmp name is the file's only link and a sweep only ever unlinks,
// so a file that still has a link still has its name (an unlinked inode cannot be linked
// again), and from the lock on no sweep removes it. NFS, which turns the unlink of a file
// open on this host into a rename, is caught at the rename instead (store_block_impl).
FileDescriptor create_tmp(const IoContext& ctx, const Location& loc, std::string& tmp,
                          bool& direct, BlockResult& result) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    tmp = tmp_file_name(loc.name);
    FileDescriptor fd =
        open_at(ctx, loc, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, direct, result);
    if (!fd) return {};
    const int locked = lock_tmp_file(fd.get());
    if (locked == EAGAIN) {
      // Someone else locked a file this writer just made: do not write into it.
      fd.reset();
      ::unlinkat(loc.dir.get(), tmp.c_str(), 0);
      result = failure(EAGAIN, "lock", loc.path_of(tmp), "tmp file locked by another process");
      return {};
    }
    // Without lock support (locked != 0) the sweep falls back to pid liveness.
    struct stat mine;
    if (locked != 0 || (::fstat(fd.get(), &mine) == 0 && mine.st_nlink > 0)) return fd;
  }
  result = failure(ENOENT, "lock", loc.path_of(tmp), "tmp file removed by another process");
  return {};
}

namespace {

BlockResult store_block_impl(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                             cuda::Event ready, bool retry_vanished = true) {
  BlockResult result;
  Location loc;
  if (!locate(ctx, op.path, /*create=*/true, loc, result)) return result;
  // No existence check before writing: the tier cannot know a key is new (other processes
  // and hosts share the root), so publish() must detect a duplicate anyway, and engines
  // store what their lookup found missing. A duplicate costs one wasted write instead of
  // every store costing a stat.
  const EngineConfig& config = *ctx.config;
  std::string tmp;
  bool direct = ctx.direct;
  FileDescriptor fd = create_tmp(ctx, loc, tmp, direct, result);
  if (!fd) return result;
  const bool fell_back = result.o_direct_fallback;
  // Holds the writer's lock (which lives as long as the open file description) from the
  // close that reports write-back errors until the tmp name is gone.
  FileDescriptor lock_holder;

  // From here on every failure removes the tmp file: nothing half-written is left behind.
  auto fail = [&](int error, const char* operation, std::string message = {}) {
    fd.reset();
    ::unlinkat(loc.dir.get(), tmp.c_str(), 0);
    lock_holder.reset();
    BlockResult r = failure(error, operation, loc.path_of(tmp), std::move(message));
    r.o_direct_fallback = fell_back;
    return r;
  };

  // open() applies the process umask, which may change at any time and usually strips group
  // and other bits: fchmod makes such a file_mode exact (reading the umask would mean setting
  // it, racing other threads' file creation). Owner-only modes pass any usual umask intact.
  if ((config.file_mode & 077) != 0 && ::fchmod(fd.get(), config.file_mode) != 0)
    return fail(errno, "fchmod");
  std::vector<Segment> scratch;
  const std::vector<Segment>* staged = staged_segments(op, direct, scratch);
  StepError written =
      staged ? write_segments(ctx, worker, fd.get(), op, *staged, ready)
             : write_in_place(ctx, worker, fd.get(), op, in_place_payload(op, scratch), direct);
  if (written) return fail(written.error, written.operation, std::move(written.message));
  if (config.durability != Durability::kNone && ::fdatasync(fd.get()) != 0)
    return fail(errno, "fdatasync");
  lock_holder = FileDescriptor(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!lock_holder) return fail(errno, "dup");
  if (int e = fd.close_checked()) return fail(e, "close");
  bool already_there = false;
  if (int e = publish(loc.dir.get(), tmp, loc.name, already_there)) {
    // The tmp name is gone although create_tmp() found the file linked: on NFS a sweep's
    // unlink of a file open on this host is a "silly rename", which keeps it linked under
    // another name. Write the block again under a new name, once.
    if (e == ENOENT && retry_vanished) {
      lock_holder.reset();
      return store_block_impl(ctx, worker, op, ready, /*retry_vanished=*/false);
    }
    return fail(e, "rename");
  }
  if (already_there) {
    ::unlinkat(loc.dir.get(), tmp.c_str(), 0);
    // Only a block file makes a store redundant: anything else in its place is a failure,
    // never a success reported forever.
    struct stat st;
    if (::fstatat(loc.dir.get(), loc.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        !S_ISREG(st.st_mode)) {
      BlockResult r = not_regular(op.path, st.st_mode);
      r.o_direct_fallback = fell_back;
      return r;
    }
  }
  lock_holder.reset();
  if (config.durability == Durability::kFull && !already_there && ::fsync(loc.dir.get()) != 0) {
    BlockResult r = failure(errno, "fsync", loc.dir_path);
    r.o_direct_fallback = fell_back;
    return r;
  }
  BlockResult r;
  // A dedup moved no bytes to storage: the tier's capacity ledger counts only new files.
  r.bytes = already_there ? 0 : op.payload_length();
  r.dedup = already_there;
  r.o_direct_fallback = fell_back;
  return r;
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

// Header and a host payload in place (contiguous or segments) in one vectored call; with
// O_DIRECT, which cannot read a partial page, a partial last page lands in the tail page.
ReadOutcome read_in_place(const IoContext& ctx, WorkerContext& worker, int fd, bool direct,
                          const BlockOp& op, const std::vector<Segment>& payload, bool want_crc) {
  ReadOutcome out;
  std::size_t tail = 0;
  std::vector<iovec> iov = file_iov(worker.header.data(), worker.tail.data(), payload, direct,
                                     /*store=*/false, tail);
  const std::size_t total = op.payload_length();
  const std::size_t want = kHeaderSize + total - tail + (tail > 0 ? kAlignment : 0);
  std::size_t got = 0;
  if (int e = preadv_full(fd, std::move(iov), 0, got)) {
    out.error = {e, "pread"};
  } else if (got < want) {
    out.short_read = true;
  } else {
    if (tail > 0) {
      const Segment& last = *std::find_if(payload.rbegin(), payload.rend(),
                                          [](const Segment& seg) { return seg.length > 0; });
      std::memcpy(static_cast<unsigned char*>(last.address) + last.length - tail,
                  worker.tail.data(), tail);
    }
    if (want_crc) out.crc = payload_crc(payload);
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
  SegmentCopier copier(ctx, worker, segments);
  if (StepError e = copier.wait_for(ready)) {
    out.error = std::move(e);
    return out;
  }
  for (std::size_t done = 0; done < total; done += lease.size()) {
    const std::size_t n = std::min(lease.size(), total - done);
    const std::size_t padded = align_up(n);
    if (done > 0) {
      if (int e = preadv_full(fd, {{lease.data(), padded}},
                              static_cast<off_t>(kHeaderSize + done), got)) {
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
bool remove_bad_file(const IoContext& ctx, const BlockOp& op, Location& loc,
                     const struct stat& read) {
  BlockResult ignored;
  if (!loc.dir && !locate(ctx, op.path, /*create=*/false, loc, ignored)) return false;
  struct stat now;
  return ::fstatat(loc.dir.get(), loc.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
         now.st_dev == read.st_dev && now.st_ino == read.st_ino &&
         ::unlinkat(loc.dir.get(), loc.name.c_str(), 0) == 0;
}

BlockResult load_block_impl(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                            cuda::Event ready) {
  const EngineConfig& config = *ctx.config;
  BlockResult result;
  Location loc;
  bool direct = ctx.direct;
  // O_NONBLOCK: opening a FIFO planted at a block path must fail the block, not hang the
  // worker (and with it drain and shutdown); it changes nothing for regular files.
  FileDescriptor fd =
      open_for_load(ctx, op, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, direct, loc, result);
  if (!fd) return result;
  const bool fell_back = result.o_direct_fallback;
  // Kept although every special file would also fail the read below (FIFOs and sockets with
  // ESPIPE, directories with EISDIR, /dev/null with a short read): reading a device planted
  // at a block path runs its driver's code, which need not honour O_NONBLOCK. One fstat, the
  // cheapest call of a load, keeps "a special file fails at once, never hangs" unconditional.
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return failure(errno, "fstat", op.path);
  if (!S_ISREG(st.st_mode)) return not_regular(op.path, st.st_mode);

  auto corrupt = [&](std::string why) {
    fd.reset();
    BlockResult r = failure(EBADMSG, "verify", op.path, std::move(why));
    r.corrupt_removed = remove_bad_file(ctx, op, loc, st);
    r.o_direct_fallback = fell_back;
    return r;
  };

  const bool want_crc = config.checksum == Checksum::kCrc32c;
  std::vector<Segment> scratch;
  const std::vector<Segment>* staged = staged_segments(op, direct, scratch);
  ReadOutcome read = staged ? read_segments(ctx, worker, fd.get(), op, *staged, want_crc, ready)
                            : read_in_place(ctx, worker, fd.get(), direct, op,
                                            in_place_payload(op, scratch), want_crc);
  if (read.error) {
    BlockResult r =
        failure(read.error.error, read.error.operation, op.path, std::move(read.error.message));
    r.o_direct_fallback = fell_back;
    return r;
  }
  if (read.short_read) return corrupt("file is truncated");
  if (!read.corrupt.empty()) return corrupt(std::move(read.corrupt));
  if (want_crc && read.header.checksum_kind == kChecksumKindCrc32c &&
      read.crc != read.header.payload_crc)
    return corrupt("payload checksum mismatch");
  BlockResult r;
  r.bytes = op.payload_length();
  r.o_direct_fallback = fell_back;
  return r;
}

// Block operations run on worker threads, which must never unwind: anything unexpected
// (allocation failure) becomes an ordinary failed block.
template <typename Fn>
BlockResult guarded(const BlockOp& op, const char* operation, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return failure(ENOMEM, operation, op.path, "out of memory");
  } catch (const std::exception& e) {
    return failure(EIO, operation, op.path, e.what());
  }
}

}  // namespace

WorkerContext::~WorkerContext() {
  if (stream_ != nullptr && ctx_.cuda != nullptr) ctx_.cuda->cudaStreamDestroy(stream_);
}

cuda::Error WorkerContext::stream(cuda::Stream& out) {
  if (stream_ == nullptr) {
    // Runtime state is per thread: select the device before creating the stream on it.
    if (cuda::Error e = ctx_.cuda->cudaSetDevice(ctx_.cuda_device)) return e;
    if (cuda::Error e = ctx_.cuda->cudaStreamCreateWithFlags(&stream_, cuda::kStreamNonBlocking))
      return e;
  }
  out = stream_;
  return cuda::kSuccess;
}

BlockResult store_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        cuda::Event ready) noexcept {
  return guarded(op, "store", [&] { return store_block_impl(ctx, worker, op, ready); });
}

BlockResult load_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       cuda::Event ready) noexcept {
  return guarded(op, "load", [&] { return load_block_impl(ctx, worker, op, ready); });
}

}  // namespace kvtier::detail
