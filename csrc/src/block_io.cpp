#include "block_io.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include <kvtier/format.hpp>

#include "header.hpp"
#include "posix_io.hpp"

namespace kvtier::detail {
namespace {

alignas(kAlignment) const unsigned char kZeroPage[kAlignment] = {};

bool is_aligned(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % kAlignment == 0;
}

BlockResult failure(int error, const char* operation, const std::string& path,
                    std::string message = {}) {
  BlockResult r;
  r.error = error;
  r.operation = operation;
  r.path = path;
  r.message = std::move(message);
  return r;
}

// Opens a block or tmp file. Falls back from O_DIRECT to buffered I/O when the file system
// refuses it (EINVAL) and the mode allows, and creates missing parent directories for files
// being created.
FileDescriptor open_block_file(const IoContext& ctx, const std::string& path, int flags,
                               bool& direct, BlockResult& result) {
  bool made_parents = false;
  for (;;) {
    int fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), ctx.config->file_mode);
    if (fd >= 0) return FileDescriptor(fd);
    const int error = errno;
    if (error == EINTR) continue;
    if (error == EINVAL && direct && ctx.config->o_direct == ODirectMode::kAuto) {
      direct = false;
      result.o_direct_fallback = true;
      continue;
    }
    if (error == ENOENT && (flags & O_CREAT) && !made_parents) {
      made_parents = true;
      const int mk = make_directories(parent_directory(path), ctx.directory_mode);
      if (mk != 0) {
        result = failure(mk, "mkdir", parent_directory(path));
        return {};
      }
      continue;
    }
    result = failure(error, "open", path);
    return {};
  }
}

// Payload writes for O_DIRECT: every address, length and offset a multiple of kAlignment.
int write_payload_direct(const IoContext& ctx, WorkerBuffers& buffers, int fd, const BlockOp& op) {
  const auto* data = static_cast<const unsigned char*>(op.data);
  if (is_aligned(data)) {
    // Caller memory goes to the device in place; only a partial last page is copied.
    const std::size_t body = op.length / kAlignment * kAlignment;
    const std::size_t rest = op.length - body;
    std::vector<iovec> iov{{buffers.header.data(), kHeaderSize}};
    if (body > 0) iov.push_back({const_cast<unsigned char*>(data), body});
    if (rest > 0) {
      std::memcpy(buffers.tail.data(), data + body, rest);
      std::memset(buffers.tail.data() + rest, 0, kAlignment - rest);
      iov.push_back({buffers.tail.data(), kAlignment});
    }
    return pwritev_full(fd, std::move(iov), 0);
  }
  if (int e = pwritev_full(fd, {{buffers.header.data(), kHeaderSize}}, 0)) return e;
  auto lease = ctx.staging->acquire();
  for (std::size_t done = 0; done < op.length; done += lease.size()) {
    const std::size_t n = std::min(lease.size(), op.length - done);
    const std::size_t padded = align_up(n);
    std::memcpy(lease.data(), data + done, n);
    std::memset(lease.data() + n, 0, padded - n);
    if (int e = pwritev_full(fd, {{lease.data(), padded}}, static_cast<off_t>(kHeaderSize + done)))
      return e;
  }
  return 0;
}

int write_payload_buffered(WorkerBuffers& buffers, int fd, const BlockOp& op) {
  std::vector<iovec> iov{{buffers.header.data(), kHeaderSize}};
  if (op.length > 0) iov.push_back({op.data, op.length});
  const std::size_t pad = align_up(op.length) - op.length;
  if (pad > 0) iov.push_back({const_cast<unsigned char*>(kZeroPage), pad});
  return pwritev_full(fd, std::move(iov), 0);
}

// Renames without replacing an existing file, so the first writer of a key wins and later
// ones become dedups. File systems without RENAME_NOREPLACE fall back to rename(), which
// replaces a file holding the same bytes.
int publish(const std::string& tmp, const std::string& final_path, bool& already_there) {
  already_there = false;
#ifdef RENAME_NOREPLACE
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) == 0)
    return 0;
  if (errno == EEXIST) {
    already_there = true;
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
#endif
  return ::rename(tmp.c_str(), final_path.c_str()) == 0 ? 0 : errno;
}

BlockResult store_block_impl(const IoContext& ctx, WorkerBuffers& buffers, const BlockOp& op) {
  struct stat st;
  if (::stat(op.path.c_str(), &st) == 0) {
    BlockResult r;
    r.dedup = true;
    return r;
  }
  const EngineConfig& config = *ctx.config;
  const std::string tmp = op.path + ctx.tmp_infix +
                          std::to_string(ctx.tmp_counter->fetch_add(1, std::memory_order_relaxed)) +
                          ".tmp";
  BlockResult result;
  bool direct = ctx.direct;
  FileDescriptor fd =
      open_block_file(ctx, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, direct, result);
  if (!fd) return result;
  const bool fell_back = result.o_direct_fallback;

  // From here on every failure removes the tmp file: nothing half-written is left behind.
  auto fail = [&](int error, const char* operation, std::string message = {}) {
    fd.reset();
    ::unlink(tmp.c_str());
    BlockResult r = failure(error, operation, tmp, std::move(message));
    r.o_direct_fallback = fell_back;
    return r;
  };

  if (ctx.need_fchmod && ::fchmod(fd.get(), config.file_mode) != 0) return fail(errno, "fchmod");
  const std::uint32_t crc =
      config.checksum == Checksum::kCrc32c ? crc32c(op.data, op.length) : 0;
  encode_header(buffers.header.data(), op.key, config.fingerprint, op.length, config.checksum, crc);
  const int written = direct ? write_payload_direct(ctx, buffers, fd.get(), op)
                             : write_payload_buffered(buffers, fd.get(), op);
  if (written != 0) return fail(written, "pwrite");
  if (config.durability != Durability::kNone && ::fdatasync(fd.get()) != 0)
    return fail(errno, "fdatasync");
  if (int e = fd.close_checked()) return fail(e, "close");
  bool already_there = false;
  if (int e = publish(tmp, op.path, already_there)) return fail(e, "rename");
  if (already_there) ::unlink(tmp.c_str());
  if (config.durability == Durability::kFull && !already_there) {
    if (int e = fsync_parent_directory(op.path)) {
      BlockResult r = failure(e, "fsync", parent_directory(op.path));
      r.o_direct_fallback = fell_back;
      return r;
    }
  }
  BlockResult r;
  r.bytes = op.length;
  r.dedup = already_there;
  r.o_direct_fallback = fell_back;
  return r;
}

// Reads header and payload. Returns 0 with `short_read` set when the file ended early.
int read_file(const IoContext& ctx, WorkerBuffers& buffers, int fd, bool direct, const BlockOp& op,
              bool& short_read, std::uint32_t& crc_out, bool want_crc) {
  auto* data = static_cast<unsigned char*>(op.data);
  std::size_t got = 0;
  short_read = false;
  if (!direct || is_aligned(data)) {
    // One system call reads header and payload; a partial last page lands in the tail buffer
    // for O_DIRECT, which cannot read a partial page.
    const std::size_t body = direct ? op.length / kAlignment * kAlignment : op.length;
    const std::size_t rest = op.length - body;
    std::vector<iovec> iov{{buffers.header.data(), kHeaderSize}};
    if (body > 0) iov.push_back({data, body});
    if (rest > 0) iov.push_back({buffers.tail.data(), kAlignment});
    const std::size_t want = kHeaderSize + body + (rest > 0 ? kAlignment : 0);
    if (int e = preadv_full(fd, std::move(iov), 0, got)) return e;
    if (got < want) {
      short_read = true;
      return 0;
    }
    if (rest > 0) std::memcpy(data + body, buffers.tail.data(), rest);
    if (want_crc) crc_out = crc32c(data, op.length);
    return 0;
  }
  // O_DIRECT into unaligned memory: page-aligned staging buffer, piece by piece.
  if (int e = preadv_full(fd, {{buffers.header.data(), kHeaderSize}}, 0, got)) return e;
  if (got < kHeaderSize) {
    short_read = true;
    return 0;
  }
  auto lease = ctx.staging->acquire();
  std::uint32_t crc = 0;
  for (std::size_t done = 0; done < op.length; done += lease.size()) {
    const std::size_t n = std::min(lease.size(), op.length - done);
    const std::size_t padded = align_up(n);
    if (int e = preadv_full(fd, {{lease.data(), padded}}, static_cast<off_t>(kHeaderSize + done), got))
      return e;
    if (got < padded) {
      short_read = true;
      return 0;
    }
    std::memcpy(data + done, lease.data(), n);
    if (want_crc) crc = crc32c(data + done, n, crc);
  }
  crc_out = crc;
  return 0;
}

BlockResult load_block_impl(const IoContext& ctx, WorkerBuffers& buffers, const BlockOp& op) {
  const EngineConfig& config = *ctx.config;
  BlockResult result;
  bool direct = ctx.direct;
  FileDescriptor fd = open_block_file(ctx, op.path, O_RDONLY | O_CLOEXEC, direct, result);
  if (!fd) return result;
  const bool fell_back = result.o_direct_fallback;

  // A bad file is removed so the next lookup is a clean miss instead of the same failure.
  auto corrupt = [&](std::string why) {
    fd.reset();
    BlockResult r = failure(EBADMSG, "verify", op.path, std::move(why));
    r.corrupt_removed = ::unlink(op.path.c_str()) == 0;
    r.o_direct_fallback = fell_back;
    return r;
  };

  const bool want_crc = config.checksum == Checksum::kCrc32c;
  bool short_read = false;
  std::uint32_t crc = 0;
  if (int e = read_file(ctx, buffers, fd.get(), direct, op, short_read, crc, want_crc)) {
    BlockResult r = failure(e, "pread", op.path);
    r.o_direct_fallback = fell_back;
    return r;
  }
  if (short_read) return corrupt("file is truncated");
  DecodedHeader header;
  std::string why = verify_header(buffers.header.data(), op.key, config.fingerprint, op.length, header);
  if (!why.empty()) return corrupt(std::move(why));
  if (want_crc && header.checksum_kind == kChecksumKindCrc32c && crc != header.payload_crc)
    return corrupt("payload checksum mismatch");
  BlockResult r;
  r.bytes = op.length;
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

BlockResult store_block(const IoContext& ctx, WorkerBuffers& buffers, const BlockOp& op) noexcept {
  return guarded(op, "store", [&] { return store_block_impl(ctx, buffers, op); });
}

BlockResult load_block(const IoContext& ctx, WorkerBuffers& buffers, const BlockOp& op) noexcept {
  return guarded(op, "load", [&] { return load_block_impl(ctx, buffers, op); });
}

}  // namespace kvtier::detail
