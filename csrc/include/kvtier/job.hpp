#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {

/// Caller-chosen job identifier; unique among jobs not yet popped as completions.
using JobId = std::int64_t;

enum class Direction : std::uint8_t { kLoad, kStore };

/// One block of a job: a file and the caller memory its payload comes from or goes to.
/// The memory must stay valid (and, for loads, untouched by the caller) until the job's
/// completion has been popped.
struct BlockOp {
  std::string path;    ///< final path of the block file
  std::string key;     ///< opaque key bytes stored in and verified against the header
  void* data = nullptr;
  std::size_t length = 0;  ///< payload bytes
};

/// The first error of a job, for logs and JobResult.error.
struct JobError {
  int errno_value = 0;     ///< 0 when the job succeeded
  std::string operation;   ///< e.g. "open", "pwrite", "rename", "verify"
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

}  // namespace kvtier
