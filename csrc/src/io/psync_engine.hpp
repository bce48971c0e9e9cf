#pragma once

#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "io/block_io.hpp"

namespace kvtier::detail {

/// Writes one block file (tmp file + rename) with pwrite. `ready` (may be null) is an event
/// recorded on the submitter's stream: device memory is copied only after it. With
/// `crc` (may be null) in_copy, the header carries crc->crc instead of a CRC taken here.
/// Never throws.
BlockResult store_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        cuda::Event ready, const CrcPlan* crc = nullptr) noexcept;

/// Reads and verifies one block file into the op's memory with pread. `ready` (may be null) is
/// an event recorded on the submitter's stream: device memory is written only after it. Never
/// throws. A file that fails verification is removed; the destination memory is then
/// unspecified. With `crc` (may be null) in_copy, a host payload read in place is not
/// checked against the header's CRC32C here: the result carries it (crc_pending) for the
/// caller's copy out to check.
BlockResult load_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       cuda::Event ready, const CrcPlan* crc = nullptr) noexcept;

/// Removes the block file at op.path if it is still the file (`dev`, `ino`) that failed
/// verification, so the next lookup is a clean miss (what load_block does with a file that
/// does not verify). True when it was removed. Touches the file system: callers under a
/// deadline run it inside the kernel phase of their batch.
bool remove_corrupt_file(const IoContext& ctx, const BlockOp& op, dev_t dev, ino_t ino);

}  // namespace kvtier::detail
