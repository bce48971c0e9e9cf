#pragma once

// The steps of a block operation that both I/O engines share (psync_engine.cpp,
// io_uring_engine.cpp); block_file.cpp defines them.

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <kvtier/job.hpp>

#include "io/block_io.hpp"
#include "io/posix_io.hpp"
#include "util/step_error.hpp"

namespace kvtier::detail {

/// A failed block operation: errno, the step's name, the path it touched, optional detail.
BlockResult failure(int error, const char* operation, const std::string& path,
                    std::string message = {});

/// The same without allocating, for paths that must not fail (catch handlers, shutdown):
/// the report names the op's own path, and `note` (a string literal) is its detail.
BlockResult unallocated_failure(int error, const char* operation, const char* note) noexcept;

/// Payloads that cannot go to the file in place move through a staging buffer as segments:
/// the op's own segments, or its contiguous buffer as one host segment when O_DIRECT meets
/// unaligned memory. Returns nullptr when the payload goes in place.
const std::vector<Segment>* staged_segments(const BlockOp& op, bool direct,
                                            std::vector<Segment>& scratch);

/// The host memory a payload that goes in place occupies: the op's segments, or its contiguous
/// buffer as one segment (held in `scratch`).
const std::vector<Segment>& in_place_payload(const BlockOp& op, std::vector<Segment>& scratch);

/// The CRC32C of a payload's bytes, segment after segment.
std::uint32_t payload_crc(const std::vector<Segment>& payload);

/// The iovecs of a whole block file over the `header` page and host memory that goes in
/// place (empty segments left out). With O_DIRECT, whose lengths are whole pages, a partial
/// last page is cut from the last iovec and read or written through `tail_page` instead;
/// `tail` is then its length. A buffered store pads with zeros to a whole page.
std::vector<iovec> file_iov(unsigned char* header, unsigned char* tail_page,
                            const std::vector<Segment>& payload, bool direct, bool store,
                            std::size_t& tail);

/// Where a block lives: its directory, opened beneath the root without following links, and
/// its name there. Every later step works relative to `dir`, so nothing that happens to the
/// path afterwards can redirect the operation.
///
/// The directory is resolved for every store, not kept open between blocks. A descriptor
/// held across blocks keeps pointing at its directory wherever that directory is moved: a
/// tenant who can rename entries of a shared root (file_mode 0o660/0o666, or a root_dir
/// writable by others) could move a fan-out directory out of the root, and every later store
/// of it would land outside root_dir; checking a cached descriptor is still beneath the root
/// takes a resolution per level, no cheaper than this one openat2. It would also rarely hit:
/// keys hash uniformly over 65,536 leaf directories. Creating directories is already paid
/// once: openat2 succeeds in one call once they exist, and only ENOENT walks and mkdirs.
struct Location {
  FileDescriptor dir;
  std::string dir_path;  // absolute, for messages
  std::string name;

  std::string path_of(const std::string& entry) const { return dir_path + "/" + entry; }
};

/// Opens the directory of `path` (creating it with `create`). On failure fills `result`
/// (a missing directory is a missing block: ENOENT "open") and returns false.
bool locate(const IoContext& ctx, const std::string& path, bool create, Location& out,
            BlockResult& result);

/// The failure for a block path that holds something other than a regular file.
BlockResult not_regular(const std::string& path, mode_t mode);

/// Opens `name` in `loc.dir`, never through a link. Falls back from O_DIRECT to buffered I/O
/// (clearing `direct`, setting result.o_direct_fallback) when the file system refuses it and
/// the mode allows; on failure fills `result` and returns an empty descriptor.
FileDescriptor open_at(const IoContext& ctx, const Location& loc, const std::string& name,
                       int flags, bool& direct, BlockResult& result);

/// Renames `tmp` to `final_name` in `dir` without replacing an existing file (RENAME_NOREPLACE;
/// plain rename where the file system lacks it). `already_there`: another writer won.
/// Returns 0 or an errno value.
int publish(int dir, const std::string& tmp, const std::string& final_name, bool& already_there);

/// Creates this writer's tmp file next to the block and locks it (OFD lock), so a sweep never
/// removes a live writer's file; sets `tmp` to its name. On failure fills `result`.
FileDescriptor create_tmp(const IoContext& ctx, const Location& loc, std::string& tmp, bool& direct,
                          BlockResult& result);

/// The files of one block operation: the block's directory and name, the descriptor in use
/// and, for a store, its tmp file's name and a duplicate of the descriptor that holds the
/// writer's OFD lock (which lives as long as the open file description) from the close that
/// reports write-back errors until the tmp name is gone.
struct BlockFile {
  Location loc;
  std::string tmp;
  FileDescriptor fd;
  FileDescriptor lock_holder;
  bool direct = false;     ///< opened with O_DIRECT
  bool fell_back = false;  ///< O_DIRECT was refused and the file opened buffered instead

  /// Removes the tmp file and closes the descriptors; the lock goes last, once the name is
  /// gone, so a sweep never sees an unlocked tmp file of a live writer.
  void discard_tmp() noexcept;
  /// A failed store step: discard_tmp(), and the failure, naming the tmp file.
  BlockResult fail_store(int error, const char* operation, std::string message = {});
};

/// The start of every store: the block's directory (created as needed), this writer's locked
/// tmp file in it (the file eviction kept for reuse where the op names one and it fits:
/// BlockOp::recycle; else a new one), opened with O_DIRECT where the engine uses it (falling
/// back where allowed), and its mode made exact. No existence check comes first: the tier cannot
/// know a key is new (other processes and hosts share the root), so publish() detects a duplicate
/// anyway, and engines store what their lookup found missing; a duplicate costs one wasted write
/// instead of every store costing a stat. On failure fills `result` and returns false.
bool open_tmp(const IoContext& ctx, const BlockOp& op, BlockFile& file, BlockResult& result);

/// The end of every store whose bytes are written (and synced, with durability): closes the
/// tmp file (a close reports deferred write errors, which must stop the publication), renames
/// it into place without replacing (a block already there makes the store a dedup, anything
/// else there a failure), and with Durability::kFull syncs the directory. Any failure removes
/// the tmp file. `vanished`: the tmp name was gone at the rename although the file was linked
/// when created (on NFS a sweep's unlink of a file open on this host is a silly rename);
/// the caller may write the block again under a new name.
BlockResult publish_tmp(const IoContext& ctx, const BlockOp& op, BlockFile& file, bool& vanished);

}  // namespace kvtier::detail
