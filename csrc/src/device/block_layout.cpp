#include <kvtier/block_layout.hpp>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

BlockLayout::BlockLayout(std::vector<Region> regions) : regions_(std::move(regions)) {
  if (regions_.empty()) throw std::invalid_argument("a block layout needs at least one region");
  num_blocks_ = std::numeric_limits<std::size_t>::max();
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    const std::string which = "region " + std::to_string(i);
    if (r.base == nullptr) throw std::invalid_argument(which + " has a null base address");
    if (r.runs.empty()) throw std::invalid_argument(which + " has no runs");
    if (r.num_blocks == 0) throw std::invalid_argument(which + " holds no blocks");
    for (const Run& run : r.runs) payload_length_ += run.length;
    num_blocks_ = std::min(num_blocks_, r.num_blocks);
    run_count_ += r.runs.size();
    has_device_memory_ = has_device_memory_ || r.kind == MemoryKind::kDevice;
  }
}

std::vector<Segment> BlockLayout::segments(std::size_t block) const {
  if (block >= num_blocks_)
    throw std::out_of_range("block " + std::to_string(block) + " is out of range (layout holds " +
                            std::to_string(num_blocks_) + " blocks)");
  std::vector<Segment> out;
  out.reserve(run_count_);
  for (const Region& r : regions_) {
    auto* start = static_cast<unsigned char*>(r.base) + block * r.block_stride;
    for (const Run& run : r.runs) {
      // Runs that continue one another (a contiguous slice) become one segment.
      if (!out.empty() && out.back().kind == r.kind &&
          static_cast<unsigned char*>(out.back().address) + out.back().length ==
              start + run.offset) {
        out.back().length += run.length;
      } else {
        out.push_back({start + run.offset, run.length, r.kind});
      }
    }
  }
  return out;
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
