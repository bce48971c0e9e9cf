#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <kvtier/export.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// Caller-chosen job identifier; unique among jobs not yet popped as completions.
using JobId = std::int64_t;

enum class Direction : std::uint8_t { kLoad, kStore };

/// Where a Segment's bytes live.
enum class MemoryKind : std::uint8_t {
  kHost,    ///< CPU memory
  kDevice,  ///< CUDA device memory (needs EngineConfig::use_cuda)
};

/// One contiguous run of a block's payload.
struct Segment {
  void* address = nullptr;
  std::size_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
};

/// One block of a job: a file and the caller memory its payload comes from or goes to.
/// The payload is either one contiguous host buffer (`data`, `length`) or, when `segments`
/// is not empty, the concatenation of the segments (e.g. one run per layer of a GPU KV cache),
/// which moves through a staging buffer. The memory must stay valid (and, for loads, untouched
/// by the caller) until the job's completion has been popped.
struct BlockOp {
  std::string path;  ///< final path of the block file
  std::string key;   ///< opaque key bytes stored in and verified against the header
  void* data = nullptr;
  std::size_t length = 0;  ///< payload bytes of `data`
  std::vector<Segment> segments;
  /// Stores only, optional: a file below the root that eviction kept for reuse under a tmp
  /// file name (see Recycling in files.hpp) to overwrite instead of creating a new one. It
  /// becomes the store's tmp file when it is a regular file of the caller's user with one link
  /// and exactly the size this store writes; otherwise it is removed and a new file created.
  /// A block that fails before its store gets that far (its directory cannot be made, the job
  /// is cancelled), or fails because the kept file's directory cannot be opened (EIO, a link
  /// on the way), leaves it where it is: the caller removes it then. A block that succeeds
  /// has consumed it.
  std::string recycle;

  /// Payload bytes, whichever form the payload takes.
  std::size_t payload_length() const noexcept {
    if (segments.empty()) return length;
    std::size_t total = 0;
    for (const Segment& s : segments) total += s.length;
    return total;
  }
};

/// The first error of a job, for logs and JobResult.error.
struct JobError {
  int errno_value = 0;    ///< 0 when the job succeeded
  std::string operation;  ///< e.g. "open", "pwrite", "rename", "verify"
  std::string path;
  std::string message;
};

/// What a finished job reports, exactly once.
struct Completion {
  JobId job_id = 0;
  Direction direction = Direction::kLoad;
  bool success = false;
  /// One entry per BlockOp, in submission order: 0 on success, else an errno value.
  std::vector<int> block_errnos;
  JobError error;
  std::uint64_t bytes = 0;  ///< payload bytes moved by successful blocks
  double seconds = 0.0;     ///< wall time from submit to completion
};

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
