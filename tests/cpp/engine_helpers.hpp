#pragma once

// Small helpers shared by the engine tests: configurations, block ops, memory at a chosen
// (mis)alignment, and a "gate" that holds a worker inside a block operation.

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <kvtier/kvtier.hpp>

#include "harness.hpp"

namespace kvtest {

inline kvtier::EngineConfig engine_config(const TempDir& dir,
                                          kvtier::ODirectMode mode = kvtier::ODirectMode::kOff,
                                          unsigned readers = 2, unsigned writers = 2) {
  kvtier::EngineConfig c;
  c.set_root_dir(dir.path());
  c.set_o_direct(mode);
  c.set_n_read_threads(readers);
  c.set_n_write_threads(writers);
  c.set_fingerprint("test-fingerprint");
  c.set_io_engine(io_engine_under_test());
  return c;
}

/// engine_config() for tests that hold workers with a Gate: without a deadline
/// (io_timeout_s 0), the only mode in which a load reads straight into the caller's memory
/// (with a deadline it reads into the worker's own buffer, which no Gate can hold).
inline kvtier::EngineConfig gated_config(const TempDir& dir,
                                         kvtier::ODirectMode mode = kvtier::ODirectMode::kOff,
                                         unsigned readers = 2, unsigned writers = 2) {
  kvtier::EngineConfig c = engine_config(dir, mode, readers, writers);
  c.set_io_timeout_s(0);
  return c;
}

inline kvtier::BlockOp block(const std::string& path, const std::string& key, void* data,
                             std::size_t length) {
  kvtier::BlockOp op;
  op.path = path;
  op.key = key;
  op.data = data;
  op.length = length;
  return op;
}

/// Submits one job and waits for its completion (the engine must have nothing else pending).
inline kvtier::Completion run_job(kvtier::Engine& engine, kvtier::JobId id, kvtier::Direction dir,
                                  std::vector<kvtier::BlockOp> blocks) {
  engine.submit(id, dir, std::move(blocks));
  std::vector<kvtier::Completion> out;
  pop_exactly(engine, 1, out);
  if (out[0].job_id != id)
    throw Failure{"run_job: got completion of job " + std::to_string(out[0].job_id) +
                  " instead of " + std::to_string(id)};
  return std::move(out[0]);
}

inline kvtier::Completion store(kvtier::Engine& engine, kvtier::JobId id, const std::string& path,
                                const std::string& key, const void* data, std::size_t length) {
  return run_job(engine, id, kvtier::Direction::kStore,
                 {block(path, key, const_cast<void*>(data), length)});
}

inline kvtier::Completion load(kvtier::Engine& engine, kvtier::JobId id, const std::string& path,
                               const std::string& key, void* data, std::size_t length) {
  return run_job(engine, id, kvtier::Direction::kLoad, {block(path, key, data, length)});
}

/// `length` bytes starting `misalign` bytes past a 4096-aligned address.
class Memory {
 public:
  Memory(std::size_t length, std::size_t misalign) : length_(length) {
    const std::size_t total =
        (misalign + length + 2 * kvtier::kAlignment) / kvtier::kAlignment * kvtier::kAlignment;
    base_ = static_cast<unsigned char*>(std::aligned_alloc(kvtier::kAlignment, total));
    if (base_ == nullptr) throw std::bad_alloc();
    std::memset(base_, 0xEE, total);
    data_ = base_ + misalign;
  }
  ~Memory() { std::free(base_); }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  unsigned char* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return length_; }
  void fill(const std::vector<unsigned char>& bytes) {
    if (length_ > 0) std::memcpy(data_, bytes.data(), length_);  // data() may be null when empty
  }
  bool equals(const std::vector<unsigned char>& bytes) const {
    return bytes.size() == length_ &&
           (length_ == 0 || std::memcmp(data_, bytes.data(), length_) == 0);
  }

 private:
  unsigned char* base_ = nullptr;
  unsigned char* data_ = nullptr;
  std::size_t length_ = 0;
};

inline bool file_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

inline off_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return st.st_size;
}

/// Flips the bits `mask` of the byte at `offset` of `path` in place: a block file damaged on
/// disk, as a bad sector or a stray write would leave it.
inline void flip_byte(const std::string& path, off_t offset, unsigned char mask = 0x01) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) FAIL("open " + path);
  unsigned char b = 0;
  if (::pread(fd, &b, 1, offset) != 1) FAIL("pread " + path);
  b ^= mask;
  if (::pwrite(fd, &b, 1, offset) != 1) FAIL("pwrite " + path);
  ::close(fd);
}

/// How a gated load fails once released: the gate file holds no valid header.
constexpr int kGateErrno = EBADMSG;

/// Holds one worker inside a load, deterministically and without sleeps: the load reads a
/// file into memory registered with userfaultfd, so the kernel parks the worker in the copy
/// until release() supplies the pages. The load then fails verification (kGateErrno; the
/// gate file is removed as corrupt, so a later load of it fails with ENOENT). Block paths
/// that are FIFOs no longer block a load (they fail at once), hence userfaultfd; handling
/// faults of kernel copies needs CAP_SYS_PTRACE (root) or vm.unprivileged_userfaultfd=1.
///
/// Only with io_timeout_s 0 (gated_config): with a deadline a load reads into the worker's
/// own buffer (except from a memory-only file system, docs/core.md "Loads from memory") and
/// a store copies the gated memory before its I/O, so neither parks in the kernel's copy.
///
/// Declare a Gate *after* the Engine it parks: if the test fails early, the Gate's destructor
/// (which runs first) lets any parked worker go, so the Engine's destructor cannot hang.
class Gate {
 public:
  explicit Gate(std::string path) : path_(std::move(path)) {}
  ~Gate() {
    release();
    // The region stays mapped (a few pages per gate, until the test program exits): the
    // released load may still be copying into it and verifying it on a worker thread.
    if (uffd_ >= 0) ::close(uffd_);
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  const std::string& path() const noexcept { return path_; }
  /// A load op whose destination is the gated memory (`scratch` is not used).
  kvtier::BlockOp op(void* /*scratch*/, std::size_t length) {
    arm(length);
    return block(path_, "gate", region_, length);
  }
  /// A store op whose source is the gated memory: the worker parks in the store's first read
  /// of the payload, and once released stores zeros. No file is left at path() (a store of
  /// an existing file is a dedup that reads nothing).
  kvtier::BlockOp store_op(std::size_t length) {
    arm(length);
    ::unlink(path_.c_str());
    return block(path_, "gate", region_, length);
  }
  /// Lets the parked load (and any later one) through. Idempotent.
  void release() {
    if (uffd_ < 0 || released_) return;
    released_ = true;
    uffdio_zeropage zero{};
    zero.range.start = reinterpret_cast<std::uintptr_t>(region_);
    zero.range.len = size_;
    ::ioctl(uffd_, UFFDIO_ZEROPAGE, &zero);  // fills the range and wakes the waiting copy
  }

 private:
  void arm(std::size_t length) {
    if (uffd_ >= 0) return;
    size_ = (length + 4095) / 4096 * 4096;
    // Header page plus payload, all zeros: the read reaches the gated memory.
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(4096 + size_)) != 0)
      throw std::runtime_error("cannot create gate file " + path_ + ": " + std::strerror(errno));
    ::close(fd);
    region_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    uffd_ = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (uffd_ < 0)
      throw std::runtime_error(std::string("userfaultfd failed (needs root or "
                                           "vm.unprivileged_userfaultfd=1): ") +
                               std::strerror(errno));
    uffdio_api api{};
    api.api = UFFD_API;
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<std::uintptr_t>(region_);
    reg.range.len = size_;
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (::ioctl(uffd_, UFFDIO_API, &api) != 0 || ::ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0)
      throw std::runtime_error(std::string("userfaultfd setup failed: ") + std::strerror(errno));
  }

  std::string path_;
  int uffd_ = -1;
  void* region_ = MAP_FAILED;
  std::size_t size_ = 0;
  bool released_ = false;
};

/// One line for a failure message: which job, errno, operation, path and detail.
inline std::string describe(const kvtier::Completion& c) {
  return "job " + std::to_string(c.job_id) + " errno " + std::to_string(c.error.errno_value) +
         " op '" + c.error.operation + "' path '" + c.error.path + "' " + c.error.message;
}

}  // namespace kvtest
