#pragma once

#include <cstddef>
#include <vector>

#include <kvtier/export.hpp>
#include <kvtier/job.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// A contiguous piece of one block inside a region, relative to the block's start.
struct Run {
  std::size_t offset = 0;
  std::size_t length = 0;
};

/// One memory region holding a slice of every block, e.g. one layer's KV tensor whose
/// dimension `block_dim` indexes blocks: block b starts at base + b * block_stride and its
/// bytes are `runs` (in C order of the slice).
struct Region {
  void* base = nullptr;
  std::size_t block_stride = 0;
  std::size_t num_blocks = 0;
  std::vector<Run> runs;
  MemoryKind kind = MemoryKind::kHost;
};

/// Where each block's payload lives across a list of regions: the payload of block b is, for
/// each region in order, its runs for b. Engines describe their KV cache once and then name
/// blocks by index.
class KVTIER_EXPORT BlockLayout {
 public:
  /// Throws std::invalid_argument for no regions, a region without runs or blocks, or a null
  /// base.
  explicit BlockLayout(std::vector<Region> regions);

  std::size_t payload_length() const noexcept { return payload_length_; }
  /// Blocks every region holds.
  std::size_t num_blocks() const noexcept { return num_blocks_; }
  bool has_device_memory() const noexcept { return has_device_memory_; }

  /// The segments of block `block`. Throws std::out_of_range past num_blocks().
  std::vector<Segment> segments(std::size_t block) const;

 private:
  std::vector<Region> regions_;
  std::size_t payload_length_ = 0;
  std::size_t num_blocks_ = 0;
  std::size_t run_count_ = 0;
  bool has_device_memory_ = false;
};

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
