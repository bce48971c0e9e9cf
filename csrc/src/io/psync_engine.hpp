#pragma once

#include <sys/stat.h>

#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "io/block_file.hpp"
#include "io/block_io.hpp"
#include "io/posix_io.hpp"

namespace kvtier::detail {

/// Writes one block file (tmp file + rename) with pwrite. `ready` (may be null) is an event
/// recorded on the submitter's stream: device memory is copied only after it. With
/// `crc` (may be null) in_copy, the header carries crc->crc instead of a CRC taken here.
/// `root_memory_now` is ctx.root_memory.now() for the caller's batch: a large payload whose
/// tmp file then holds only memory is written in checked pieces (as OpenedStore::memory_only).
/// Never throws.
BlockResult store_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        cuda::Event ready, const CrcPlan* crc = nullptr,
                        bool root_memory_now = false) noexcept;

/// Reads and verifies one block file into the op's memory with pread. `ready` (may be null) is
/// an event recorded on the submitter's stream: device memory is written only after it. Never
/// throws. A file that fails verification is removed; the destination memory is then
/// unspecified. With `crc` (may be null) in_copy, a host payload read in place is not
/// checked against the header's CRC32C here: the result carries it (crc_pending) for the
/// caller's copy out to check. `root_memory_now` is ctx.root_memory.now(), asked once for the
/// caller's batch: a file that then holds only memory is read in checked pieces (OpenedLoad::
/// memory_only); false reads every file in one call.
BlockResult load_block(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       cuda::Event ready, const CrcPlan* crc = nullptr,
                       bool root_memory_now = false) noexcept;

/// A block file opened for a load (open_load) and not read yet: load_block in two steps,
/// for a caller that decides between them how the payload is read (the worker reads a file of
/// a memory-backed file system straight into the caller's memory, worker.cpp).
struct OpenedLoad {
  FileDescriptor fd;
  Location loc;  // filled only where the open went through the block's directory
  struct stat st{};
  bool direct = false;     ///< opened with O_DIRECT
  bool fell_back = false;  ///< O_DIRECT was refused and the file opened buffered instead
  /// The file holds only memory (RootMemory::holds; load_block asks, the worker's loads from
  /// memory set it): read_load reads it in pieces, checking each as it lands, where a read is
  /// a copy and the pieces cost no storage round trips.
  bool memory_only = false;
};

/// load_block's first steps: opens op.path below the root (O_DIRECT where the engine uses it,
/// falling back where allowed) and checks that it is a regular file. On failure fills
/// `result` (exactly as load_block reports it) and returns false. Never throws.
bool open_load(const IoContext& ctx, const BlockOp& op, OpenedLoad& file,
               BlockResult& result) noexcept;

/// The rest of load_block on a file open_load opened: reads and verifies it into the op's
/// memory, removing it if it does not verify. Never throws.
BlockResult read_load(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                      OpenedLoad& file, cuda::Event ready, const CrcPlan* crc = nullptr) noexcept;

/// store_block in three steps, for a caller that writes the payload outside its deadline
/// (the worker's stores to a file system of memory, worker.cpp): open_store creates the
/// block's directory and this writer's locked tmp file and fstats it (`st`, for
/// RootMemory::holds); write_store writes the header and the payload, its CRC32C taken from
/// the op's memory (in checked pieces where `memory_only`); publish_store syncs the file
/// (with durability) and renames it into place.
/// A step that fails removes the tmp file and says why in its result (open_store: in
/// `result`, returning false); a tmp file no step failed on is removed by discard_tmp().
/// Never throw.
struct OpenedStore {
  BlockFile file;
  struct stat st{};
  /// The tmp file holds only memory (RootMemory::holds; the worker's stores to memory set
  /// it): write_store writes a large payload in pieces, each piece's CRC32C taken right
  /// before it is written, while it is in the core's cache.
  bool memory_only = false;
};
bool open_store(const IoContext& ctx, const BlockOp& op, OpenedStore& store,
                BlockResult& result) noexcept;
BlockResult write_store(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                        OpenedStore& store, cuda::Event ready) noexcept;
BlockResult publish_store(const IoContext& ctx, const BlockOp& op, OpenedStore& store) noexcept;

/// Removes the block file at op.path if it is still the file (`dev`, `ino`) that failed
/// verification, so the next lookup is a clean miss (what load_block does with a file that
/// does not verify). True when it was removed. Touches the file system: callers under a
/// deadline run it inside the kernel phase of their batch.
bool remove_corrupt_file(const IoContext& ctx, const BlockOp& op, dev_t dev, ino_t ino);

}  // namespace kvtier::detail
