#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <kvtier/config.hpp>
#include <kvtier/job.hpp>

#include "fs/beneath.hpp"
#include "device/cuda_runtime.hpp"
#include "device/staging_pool.hpp"
#include "io/ring.hpp"

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
  /// kIoUring: the workers make rings (the engine in use, never kAuto).
  IoEngine io_engine = IoEngine::kPsync;
};

/// What each worker owns, so the hot path allocates nothing: scratch pages, once it has moved
/// device memory its own CUDA stream (so workers' copies overlap), and with the io_uring
/// engine its own ring (made on the worker thread, the only one that submits to it).
class WorkerContext {
 public:
  explicit WorkerContext(const IoContext& ctx) : ctx_(ctx) {}
  ~WorkerContext();
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  /// The worker's stream, created on first use. Returns 0 or a CUDA error.
  cuda::Error stream(cuda::Stream& out);

  /// The worker's io_uring, set up on first use; null with the psync engine, or when the
  /// kernel refused this worker a ring (it then works with psync, like the engine's fallback).
  Ring* ring() noexcept;

  AlignedBuffer header{kHeaderSize};
  AlignedBuffer tail{kAlignment};
  /// With a ring: a header page and a tail page for each block of a batch.
  AlignedBuffer batch_pages;

 private:
  const IoContext& ctx_;
  cuda::Stream stream_ = nullptr;
  std::unique_ptr<Ring> ring_;
  bool ring_tried_ = false;
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

// ThreadSanitizer tracks descriptors through the close() it intercepts and cannot see a close
// the kernel does for the ring: another thread's reuse of the number looks like a race to it.
// Under TSan a load's close runs synchronously, as the io_uring engine does for a close the
// ring did not run; other builds close loaded files in the ring (stores always close here).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kRingClosesFiles = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kRingClosesFiles = false;
#else
inline constexpr bool kRingClosesFiles = true;
#endif
#else
inline constexpr bool kRingClosesFiles = true;
#endif

/// The largest number of blocks one call of run_blocks takes (a worker's batch).
inline constexpr std::size_t kMaxBatchBlocks = 8;

/// Runs `n` (at most kMaxBatchBlocks) blocks of one job, all loads or all stores, and sets
/// `results[i]` for `ops[i]`. With a ring the blocks' operations reach the kernel in one
/// submission (block_io_uring.cpp); without one they run one after another with psync.
/// Never throws.
void run_blocks(const IoContext& ctx, WorkerContext& worker, bool is_load,
                const BlockOp* const* ops, std::size_t n, cuda::Event ready,
                BlockResult* results) noexcept;

}  // namespace kvtier::detail
