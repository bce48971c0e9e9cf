// The steps of a block operation both I/O engines share (psync: psync_engine.cpp, io_uring:
// io_uring_engine.cpp): how a payload meets the file (in place or staged), the file's iovecs,
// resolving and opening beneath the root, the tmp file and its publication.
#include "io/block_file.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include <kvtier/files.hpp>
#include <kvtier/format.hpp>

#include "fs/beneath.hpp"
#include "io/posix_io.hpp"

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

BlockResult unallocated_failure(int error, const char* operation, const char* note) noexcept {
  BlockResult r;
  r.error = error;
  r.operation = operation;
  r.note = note;
  return r;
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
    } else if (e.error == ESTALE && !create) {
      // A directory another host removed, looked up here before (see open_at).
      result = failure(ENOENT, "open", path, "stale file handle: treated as absent");
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
    // NFS-like clients answer ESTALE for a name they looked up before another host removed
    // the file (an eviction): for a load that is a missing block, as ENOENT is.
    if (error == ESTALE && !(flags & O_CREAT)) {
      result = failure(ENOENT, "open", loc.path_of(name), "stale file handle: treated as absent");
      return {};
    }
    result = failure(error, "open", loc.path_of(name),
                     error == ELOOP ? "found a symbolic link where a block file belongs; links "
                                      "below root_dir are never followed"
                                    : "");
    return {};
  }
}

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
FileDescriptor create_tmp(const IoContext& ctx, const Location& loc, std::string& tmp, bool& direct,
                          BlockResult& result) {
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

// A file eviction kept for reuse (BlockOp::recycle) as this store's tmp file: renamed next
// to the block under a new tmp name, looked at (a regular file only), opened for writing
// without blocking, locked, and used only if it is a regular file of this user with one link
// and exactly the size the store writes (every byte of it is then overwritten). Otherwise, or
// when any step fails, it is removed (a block that succeeds has consumed it) and an empty
// descriptor returned, for a new file to be created. The rename comes before the open so that
// no reader can open it by the evicted block's name any more; a reader that opened it before
// eviction may still read it while it is overwritten and then fails the block's checksum.
// `unreachable`: the kept file's directory could not be opened for another reason than its
// absence (EIO, EMFILE, a link planted on the way): the file may still be there, where this
// store cannot remove it, so the block fails (`result`, naming it) and the caller, who sees
// the block failed, removes it (BlockOp::recycle).
FileDescriptor adopt_recycled(const IoContext& ctx, const BlockOp& op, const Location& loc,
                              std::string& tmp, bool& direct, bool& fell_back, BlockResult& result,
                              bool& unreachable) {
  Location from;
  BlockResult where;
  if (!locate(ctx, op.recycle, /*create=*/false, from, where)) {
    unreachable = where.error != ENOENT;
    if (unreachable) result = where;
    return {};
  }
  // The new name is this writer's own (tmp_file_name): a plain rename replaces nothing.
  tmp = tmp_file_name(loc.name);
  if (::renameat(from.dir.get(), from.name.c_str(), loc.dir.get(), tmp.c_str()) != 0) {
    ::unlinkat(from.dir.get(), from.name.c_str(), 0);
    return {};
  }
  // Whoever may write the directory may have put something else at the kept file's name:
  // only a regular file is opened (O_NONBLOCK, O_NOCTTY: a FIFO or a device that replaced it
  // after this look fails the open or the checks below instead of hanging the worker).
  struct stat st;
  if (::fstatat(loc.dir.get(), tmp.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISREG(st.st_mode)) {
    ::unlinkat(loc.dir.get(), tmp.c_str(), 0);
    return {};
  }
  BlockResult opened;
  bool open_direct = direct;
  FileDescriptor fd =
      open_at(ctx, loc, tmp, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, open_direct, opened);
  const mode_t mode = ctx.config->file_mode;
  const bool usable =
      fd && lock_tmp_file(fd.get()) != EAGAIN && ::fstat(fd.get(), &st) == 0 &&
      S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == ::geteuid() &&
      static_cast<std::uint64_t>(st.st_size) == kHeaderSize + align_up(op.payload_length()) &&
      ((st.st_mode & 07777) == mode || ::fchmod(fd.get(), mode) == 0);
  if (!usable) {
    fd.reset();
    ::unlinkat(loc.dir.get(), tmp.c_str(), 0);
    return {};
  }
  direct = open_direct;
  fell_back = opened.o_direct_fallback;
  return fd;
}

void BlockFile::discard_tmp() noexcept {
  fd.reset();
  ::unlinkat(loc.dir.get(), tmp.c_str(), 0);
  lock_holder.reset();
}

BlockResult BlockFile::fail_store(int error, const char* operation, std::string message) {
  discard_tmp();
  BlockResult r = failure(error, operation, loc.path_of(tmp), std::move(message));
  r.o_direct_fallback = fell_back;
  return r;
}

bool open_tmp(const IoContext& ctx, const BlockOp& op, BlockFile& file, BlockResult& result) {
  if (!locate(ctx, op.path, /*create=*/true, file.loc, result)) return false;
  file.direct = ctx.direct;
  if (!op.recycle.empty()) {
    bool unreachable = false;
    file.fd = adopt_recycled(ctx, op, file.loc, file.tmp, file.direct, file.fell_back, result,
                             unreachable);
    if (file.fd) {
      result.o_direct_fallback = file.fell_back;
      return true;  // its mode was made exact, whatever the umask
    }
    if (unreachable) return false;
  }
  file.fd = create_tmp(ctx, file.loc, file.tmp, file.direct, result);
  if (!file.fd) return false;
  file.fell_back = result.o_direct_fallback;
  // open() applies the process umask, which may change at any time and usually strips group
  // and other bits: fchmod makes such a file_mode exact (reading the umask would mean setting
  // it, racing other threads' file creation). Owner-only modes pass any usual umask intact.
  const mode_t mode = ctx.config->file_mode;
  if ((mode & 077) != 0 && ::fchmod(file.fd.get(), mode) != 0) {
    result = file.fail_store(errno, "fchmod");
    return false;
  }
  return true;
}

namespace {

// Where another writer's rename won: only a block file makes a store redundant; anything else
// in its place is a failure, never a success reported forever.
bool dedup_target_is_a_block(const BlockFile& file, const BlockOp& op, BlockResult& result) {
  struct stat st;
  if (::fstatat(file.loc.dir.get(), file.loc.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      !S_ISREG(st.st_mode)) {
    result = not_regular(op.path, st.st_mode);
    result.o_direct_fallback = file.fell_back;
    return false;
  }
  return true;
}

}  // namespace

BlockResult publish_tmp(const IoContext& ctx, const BlockOp& op, BlockFile& file, bool& vanished) {
  vanished = false;
  if (!file.lock_holder) {
    file.lock_holder = FileDescriptor(::fcntl(file.fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!file.lock_holder) return file.fail_store(errno, "dup");
  }
  if (int e = file.fd.close_checked()) return file.fail_store(e, "close");
  bool already_there = false;
  if (int e = publish(file.loc.dir.get(), file.tmp, file.loc.name, already_there)) {
    vanished = e == ENOENT;
    return file.fail_store(e, "rename");
  }
  BlockResult result;
  if (already_there) {
    ::unlinkat(file.loc.dir.get(), file.tmp.c_str(), 0);
    if (!dedup_target_is_a_block(file, op, result)) {
      file.lock_holder.reset();
      return result;
    }
  }
  file.lock_holder.reset();
  if (ctx.config->durability == Durability::kFull && !already_there &&
      ::fsync(file.loc.dir.get()) != 0) {
    result = failure(errno, "fsync", file.loc.dir_path);
    result.o_direct_fallback = file.fell_back;
    return result;
  }
  // A dedup moved no bytes to storage: the tier's capacity ledger counts only new files.
  result.bytes = already_there ? 0 : op.payload_length();
  result.dedup = already_there;
  result.o_direct_fallback = file.fell_back;
  return result;
}

}  // namespace kvtier::detail
