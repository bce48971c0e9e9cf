#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include <kvtier/config.hpp>
#include <kvtier/job.hpp>

#include "beneath.hpp"
#include "cuda_runtime.hpp"
#include "staging_pool.hpp"

namespace kvtier::detail {

/// What one block operation did; turned into the job's per-block status and stats.
struct BlockResult {
  int error = 0;               ///< 0 or an errno value
  const char* operation = "";  ///< the step that failed
  std::string path;            ///< the file the failing step touched
  std::string message;         ///< detail beyond strerror (e.g. which header field)
  std::uint64_t bytes = 0;     ///< payload bytes moved
  bool dedup = false;          ///< store skipped: the block file already existed
  bool corrupt_removed = false;
  bool o_direct_fallback = false;

  bool ok() const noexcept { return error == 0; }
};

/// Engine-wide, read-only state the block operations share.
struct IoContext {
  const EngineConfig* config = nullptr;
  bool direct = false;           ///< open block files with O_DIRECT
  const RootDir* root = nullptr;  ///< block paths must lie below it; resolved from it
  mode_t directory_mode = 0700;   ///< for directories created on the way to a block
  StagingPool* staging = nullptr;
  const cuda::Api* cuda = nullptr;  ///< set when device segments are allowed
  int cuda_device = 0;
};

/// What each worker owns, so the hot path allocates nothing: scratch pages and, once it has
/// moved device memory, its own CUDA stream (so workers' copies overlap).
class WorkerContext {
 public:
  explicit WorkerContext(const IoContext& ctx) : ctx_(ctx) {}
  ~WorkerContext();
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  /// The worker's stream, created on first use. Returns 0 or a CUDA error.
  cuda::Error stream(cuda::Stream& out);

  AlignedBuffer header{kHeaderSize};
  AlignedBuffer tail{kAlignment};

 private:
  const IoContext& ctx_;
  cuda::Stream stream_ = nullptr;
};

/// Writes one block file (tmp file + rename). `ready` (may be null) is an event recorded on
/// the submitter's stream: device memory is copied only after it. Never throws.
BlockResult store_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        cuda::Event ready) noexcept;

/// Reads and verifies one block file into the op's memory. `ready` (may be null) is an event
/// recorded on the submitter's stream: device memory is written only after it. Never throws.
/// A file that fails verification is removed; the destination memory is then unspecified.
BlockResult load_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       cuda::Event ready) noexcept;

}  // namespace kvtier::detail
