#pragma once

// The seam between the scheduler (engine/) and the I/O engines (psync_engine.cpp,
// io_uring_engine.cpp): what a block operation reports, the engine-wide state block
// operations share, and the one call a worker makes per batch (run_blocks).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <kvtier/config.hpp>
#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "device/staging_pool.hpp"
#include "engine/settings.hpp"
#include "fs/beneath.hpp"
#include "fs/memory_fs.hpp"

namespace kvtier::detail {

/// What one block operation did; turned into the job's per-block status and stats.
struct BlockResult {
  int error = 0;               ///< 0 or an errno value
  const char* operation = "";  ///< the step that failed
  std::string path;            ///< the file the failing step touched; empty: the op's path
  std::string message;         ///< detail beyond strerror (e.g. which header field)
  /// Detail where `message` is empty: a string with static storage, so that a failure can be
  /// described without allocating (out of memory, shutdown; see unallocated_failure).
  const char* note = nullptr;
  std::uint64_t bytes = 0;     ///< payload bytes moved
  bool dedup = false;          ///< store skipped: the block file already existed
  bool corrupt_removed = false;
  bool o_direct_fallback = false;
  /// Nonzero on one result of the batch in which the worker gave its io_uring up: the errno
  /// io_uring_enter kept answering (the blocks themselves were all run; see run_ring_batch).
  int ring_retired_errno = 0;
  /// A load run with CrcPlan::in_copy that verified all but its payload's CRC32C: the bytes
  /// are in place, and whoever copies them out must check their CRC against `expected_crc`
  /// before the block counts as loaded; a mismatch is the checksum failure the engine would
  /// have reported (EBADMSG "verify"), and the file read (`file_dev`, `file_ino`) is removed
  /// as a failed verification's is (remove_corrupt_file).
  bool crc_pending = false;
  std::uint32_t expected_crc = 0;
  dev_t file_dev = 0;
  ino_t file_ino = 0;
  /// Loaded under a deadline straight into the caller's memory from a file that holds only
  /// memory (fs/memory_fs.hpp), or stored straight from it into such a file, without the
  /// worker's arena (EngineStats::memory_fs_loads, memory_fs_stores).
  bool from_memory_fs = false;

  bool ok() const noexcept { return error == 0; }
};

/// What a block operation's caller already does about the payload's CRC32C in its own copy
/// steps (the owned-payload path, owned_payload.hpp, which copies every payload of a batch
/// under a deadline once anyway), so the I/O engines skip their separate pass over it.
/// Ignored with checksum "none".
struct CrcPlan {
  /// Store: `crc` is the payload's CRC32C, taken while the payload was copied in; the header
  /// carries it. Load: the payload's CRC is left to the copy out (BlockResult::crc_pending).
  bool in_copy = false;
  std::uint32_t crc = 0;
};

/// Engine-wide, read-only state the block operations share.
struct IoContext {
  const EngineSettings* config = nullptr;  ///< the engine's (validated) settings
  bool direct = false;                     ///< open block files with O_DIRECT
  const RootDir* root = nullptr;           ///< block paths must lie below it; resolved from it
  mode_t directory_mode = 0700;            ///< for directories created on the way to a block
  StagingPool* staging = nullptr;
  const cuda::Api* cuda = nullptr;  ///< set when device segments are allowed
  int cuda_device = 0;
  /// Whether the root's file system holds only memory (learnt when the engine starts): loads
  /// under a deadline try to skip the arena (worker.cpp), loads read in checked pieces.
  RootMemory root_memory;
  /// kIoUring: the workers make rings (the engine in use, never kAuto).
  IoEngine io_engine = IoEngine::kPsync;
};

class WorkerContext;

/// The largest number of blocks one call of run_blocks takes (a worker's batch).
inline constexpr std::size_t kMaxBatchBlocks = 8;

/// Runs `n` (at most kMaxBatchBlocks) blocks of one job, all loads or all stores, and sets
/// `results[i]` for `ops[i]`. With a ring the blocks' operations reach the kernel in one
/// submission (io_uring_engine.cpp); without one they run one after another on the psync
/// engine (psync_engine.cpp). `crc` (may be null) holds a CrcPlan per op.
/// Never throws.
void run_blocks(const IoContext& ctx, WorkerContext& worker, bool is_load,
                const BlockOp* const* ops, std::size_t n, cuda::Event ready, BlockResult* results,
                const CrcPlan* crc = nullptr) noexcept;

}  // namespace kvtier::detail
