#pragma once

// Small helpers shared by the engine tests: configurations, block ops, memory at a chosen
// (mis)alignment, and a "gate" that holds a worker inside a block operation.

#include <fcntl.h>
#include <sys/stat.h>
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
  c.root_dir = dir.path();
  c.o_direct = mode;
  c.n_read_threads = readers;
  c.n_write_threads = writers;
  c.fingerprint = "test-fingerprint";
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

/// Holds one worker inside a load: the load opens a FIFO, and open(O_RDONLY) of a FIFO
/// blocks until a writer appears. release() opens the write end (and keeps it open), which
/// lets the load go on; it then fails, since a FIFO cannot be pread (ESPIPE). Deterministic,
/// no sleeps. The write end stays open because an engine with O_DIRECT opens the FIFO twice:
/// the first open (with O_DIRECT) returns EINVAL only after a writer appeared, and the
/// buffered retry must not block again.
///
/// Declare a Gate *after* the Engine it parks: if the test fails early, the Gate's destructor
/// (which runs first) lets any parked worker go, so the Engine's destructor cannot hang.
class Gate {
 public:
  explicit Gate(std::string path) : path_(std::move(path)) {
    if (::mkfifo(path_.c_str(), 0600) != 0)
      throw std::runtime_error("mkfifo(" + path_ + ") failed: " + std::strerror(errno));
  }
  ~Gate() {
    release();
    ::unlink(path_.c_str());  // a load that comes later fails with ENOENT instead of blocking
    ::close(writer_);
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  const std::string& path() const noexcept { return path_; }
  kvtier::BlockOp op(void* scratch, std::size_t length) const {
    return block(path_, "gate", scratch, length);
  }
  /// Lets the parked load (and any later one) through. Idempotent.
  void release() {
    // O_RDWR never blocks on a FIFO and counts as a writer.
    if (writer_ < 0) writer_ = ::open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (writer_ < 0)
      throw std::runtime_error("open(" + path_ + ") failed: " + std::strerror(errno));
  }

 private:
  std::string path_;
  int writer_ = -1;
};

/// One line for a failure message: which job, errno, operation, path and detail.
inline std::string describe(const kvtier::Completion& c) {
  return "job " + std::to_string(c.job_id) + " errno " + std::to_string(c.error.errno_value) +
         " op '" + c.error.operation + "' path '" + c.error.path + "' " + c.error.message;
}

}  // namespace kvtest
