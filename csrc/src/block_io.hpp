#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

#include <kvtier/config.hpp>
#include <kvtier/job.hpp>

#include "aligned_buffer.hpp"

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
  bool direct = false;             ///< open block files with O_DIRECT
  bool need_fchmod = false;        ///< the umask would strip bits of config->file_mode
  mode_t directory_mode = 0700;    ///< for directories created on the way to a block
  std::string tmp_infix;           ///< ".<host>.<pid>." inserted before the unique number
  StagingPool* staging = nullptr;
  std::atomic<std::uint64_t>* tmp_counter = nullptr;
};

/// Scratch memory each worker owns, so the hot path allocates nothing.
struct WorkerBuffers {
  AlignedBuffer header{kHeaderSize};
  AlignedBuffer tail{kAlignment};
};

/// Writes one block file (tmp file + rename). Never throws.
BlockResult store_block(const IoContext& ctx, WorkerBuffers& buffers, const BlockOp& op) noexcept;

/// Reads and verifies one block file into op.data. Never throws. A file that fails
/// verification is removed; the destination memory is then unspecified.
BlockResult load_block(const IoContext& ctx, WorkerBuffers& buffers, const BlockOp& op) noexcept;

}  // namespace kvtier::detail
