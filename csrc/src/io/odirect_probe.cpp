#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <kvtier/engine.hpp>
#include <kvtier/format.hpp>

#include "device/aligned_buffer.hpp"
#include "io/posix_io.hpp"

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {
namespace {

// A full file system or quota. The probe's answer lasts the engine's life: concluding "no
// O_DIRECT" from it would leave an engine started on a momentarily full volume on buffered
// I/O for good, or refuse to start one with o_direct on, though evictions soon make room.
bool out_of_room(int error) noexcept {
  return error == ENOSPC || error == EDQUOT;
}

}  // namespace

std::string probe_o_direct(const std::string& dir) {
  static std::atomic<std::uint64_t> counter{0};
  const std::string path = dir + "/.kvtier-odirect-probe." + std::to_string(::getpid()) + "." +
                           std::to_string(counter.fetch_add(1));
  // Created without O_DIRECT and reopened with it: file systems that refuse O_DIRECT (ramfs,
  // many FUSE clients) may create the file and then fail the open, and the probe must remove
  // what it made whichever step fails.
  detail::FileDescriptor created(
      ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!created) {
    // Out of inodes or quota: nothing can be probed, and nothing speaks against O_DIRECT. A
    // file system that refuses it fails each block file's O_DIRECT open, and "auto" then
    // falls back per file.
    if (out_of_room(errno)) return {};
    return std::string("cannot create a probe file: ") + std::strerror(errno);
  }
  created.reset();
  std::string reason;
  detail::FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_DIRECT));
  if (!fd) {
    reason = std::string("open(O_DIRECT) failed: ") + std::strerror(errno);
  } else {
    detail::AlignedBuffer buffer(kAlignment);
    std::memset(buffer.data(), 0x5A, kAlignment);
    std::size_t got = 0;
    if (int e = detail::pwritev_full(fd.get(), {{buffer.data(), kAlignment}}, 0)) {
      // Out of room (see out_of_room): the O_DIRECT open worked, which is the question.
      if (!out_of_room(e)) reason = std::string("O_DIRECT write failed: ") + std::strerror(e);
    } else if (int e2 = detail::preadv_full(fd.get(), {{buffer.data(), kAlignment}}, 0, got)) {
      reason = std::string("O_DIRECT read failed: ") + std::strerror(e2);
    } else if (got != kAlignment) {
      reason = "O_DIRECT read returned a short page";
    }
    fd.reset();
  }
  ::unlink(path.c_str());
  return reason;
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
