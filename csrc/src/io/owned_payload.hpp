#pragma once

// Block operations that may be abandoned (EngineConfig::io_timeout_s > 0) move bytes only
// through memory the worker owns: a store's payload is copied in before any system call, a
// load's is copied out only after the worker has claimed its batch (Batch::claim). A worker
// abandoned inside the kernel then writes into, and reads from, nothing but its own buffers,
// which it frees itself when the kernel returns.
//
// The two copy steps are one function each (copy_into_owned, copy_out_of_owned), and each
// takes the payload's CRC32C in the same pass over host memory (crc32c_copy), so that under
// a deadline the checksum costs next to nothing beyond the copy the deadline needs anyway:
// the I/O engines then skip their own pass over the payload (CrcPlan, block_io.hpp). Device
// memory is copied by CUDA into the (pinned) arena and the CRC taken there, a pass over
// memory the worker has just written.

#include <cstddef>
#include <cstdint>

#include <kvtier/job.hpp>

#include "device/aligned_buffer.hpp"
#include "device/cuda_runtime.hpp"
#include "io/block_io.hpp"
#include "util/step_error.hpp"

namespace kvtier::detail {

class WorkerContext;

/// A worker's own copies of a batch's blocks: each op a copy of the caller's (path, key) with
/// its payload in one arena the worker keeps from batch to batch (grown when a batch needs
/// more; registered with CUDA when the engine moves device memory, so device copies run at
/// pinned speed). Used by one worker thread only.
///
/// The arena is always a whole number of huge pages (an AlignedBuffer of at least
/// kHugePageSize: its own 2 MiB-aligned mapping, advised for THP and pre-faulted), and each
/// payload starts at a page-aligned offset, so a 2 MiB payload fills exactly one huge page:
/// an O_DIRECT request then covers one physically contiguous piece of memory (see
/// aligned_buffer.hpp), as it does from the caller's own huge-page buffers.
class OwnedPayloads {
 public:
  OwnedPayloads() = default;
  ~OwnedPayloads();
  OwnedPayloads(const OwnedPayloads&) = delete;
  OwnedPayloads& operator=(const OwnedPayloads&) = delete;

  /// Makes the owned copies of `ops[0..n)` (n at most kMaxBatchBlocks). Throws std::bad_alloc.
  void prepare(const IoContext& ctx, const BlockOp* const* ops, std::size_t n);

  /// Copies of `ops[0..n)` as they are, payload left where the caller has it: what a kernel
  /// phase that may be abandoned reads of an op (its path, key and length) while the batch's
  /// job may be reported and freed (the memory paths, worker.cpp). Reuses the strings' room
  /// from batch to batch. Throws std::bad_alloc.
  void copy_ops(const BlockOp* const* ops, std::size_t n);

  /// The owned copy of block `i` (after prepare: host memory, contiguous, page aligned;
  /// after copy_ops: the caller's payload).
  BlockOp& op(std::size_t i) noexcept { return ops_[i]; }
  unsigned char* payload(std::size_t i) const noexcept {
    return static_cast<unsigned char*>(ops_[i].data);
  }
  /// The arena (for tests: its size and where it lies).
  const AlignedBuffer& arena() const noexcept { return arena_; }

 private:
  void grow(const IoContext& ctx, std::size_t bytes);
  void unregister() noexcept;

  AlignedBuffer arena_;
  const cuda::Api* registered_with_ = nullptr;  // arena_ is registered with this runtime
  BlockOp ops_[kMaxBatchBlocks];
};

/// Whether every byte of `op`'s payload is host memory (a contiguous buffer or host
/// segments): copy_out_of_owned can then take its CRC in the copy.
bool payload_in_host_memory(const BlockOp& op) noexcept;

/// The store's copy-in step: the caller's payload of `op` (host or device, contiguous or
/// segments) into `owned` (op.payload_length() bytes, then zeros to the page's end), after
/// the submitter's `ready` event for device memory. With `crc` (may be null: none wanted),
/// *crc is the payload's CRC32C: taken in the copy for host memory, from `owned` after the
/// CUDA copy for device memory. Never throws.
StepError copy_into_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                          unsigned char* owned, cuda::Event ready,
                          std::uint32_t* crc = nullptr) noexcept;

/// The load's copy-out step: `owned` (a payload whose header verified) into the caller's
/// memory of `op`. Only after the worker claimed its batch. With `crc` (may be null: none
/// wanted), *crc is the CRC32C of the bytes copied, taken in the same pass for host memory
/// (for device memory a pass over `owned` after the copy, which is why the worker asks for
/// it only where payload_in_host_memory(op)). The caller must compare it with the header's
/// before it reports the block loaded: the bytes are in the caller's memory by then,
/// whatever they are, which is harmless only because the job is not reported yet and a block
/// that fails is never reported loaded. Never throws.
StepError copy_out_of_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                            const unsigned char* owned, cuda::Event ready,
                            std::uint32_t* crc = nullptr) noexcept;

}  // namespace kvtier::detail
