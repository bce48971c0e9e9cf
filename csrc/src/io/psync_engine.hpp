#pragma once

#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "io/block_io.hpp"

namespace kvtier::detail {

/// Writes one block file (tmp file + rename) with pwrite. `ready` (may be null) is an event
/// recorded on the submitter's stream: device memory is copied only after it. Never throws.
BlockResult store_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        cuda::Event ready) noexcept;

/// Reads and verifies one block file into the op's memory with pread. `ready` (may be null) is
/// an event recorded on the submitter's stream: device memory is written only after it. Never
/// throws. A file that fails verification is removed; the destination memory is then
/// unspecified.
BlockResult load_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       cuda::Event ready) noexcept;

}  // namespace kvtier::detail
