#include "engine/job.hpp"

#include <stdexcept>
#include <string>

#include <kvtier/format.hpp>

namespace kvtier::detail {

bool check_blocks(const std::vector<BlockOp>& blocks, Direction direction, bool cuda_enabled) {
  bool any_device = false;
  for (const BlockOp& op : blocks) {
    if (op.path.empty()) throw std::invalid_argument("block path must not be empty");
    if (direction == Direction::kLoad && !op.recycle.empty())
      throw std::invalid_argument("only a store can recycle a file: " + op.path);
    if (op.data == nullptr && op.length > 0)
      throw std::invalid_argument("block data must not be null: " + op.path);
    if (!op.segments.empty() && op.data != nullptr)
      throw std::invalid_argument("a block takes data/length or segments, not both: " + op.path);
    for (const Segment& seg : op.segments) {
      if (seg.address == nullptr && seg.length > 0)
        throw std::invalid_argument("segment address must not be null: " + op.path);
      if (seg.kind == MemoryKind::kDevice) any_device = true;
    }
    if (any_device && !cuda_enabled)
      throw std::invalid_argument("device memory needs an engine created with use_cuda: " +
                                  op.path);
    if (op.key.size() > kMaxKeySize)
      throw std::invalid_argument("block key longer than " + std::to_string(kMaxKeySize) +
                                  " bytes: " + op.path);
  }
  return any_device;
}

std::unique_ptr<Job> make_job(JobId id, Direction direction, std::vector<BlockOp> blocks) {
  auto job = std::make_unique<Job>();
  job->id = id;
  job->direction = direction;
  job->blocks = std::move(blocks);
  job->block_errnos.assign(job->blocks.size(), 0);
  job->remaining = job->blocks.size();
  job->submitted = Clock::now();
  // Everything a queued load may need later is allocated now: parking never allocates.
  if (direction == Direction::kLoad) job->parking.resize(job->blocks.size());
  return job;
}

}  // namespace kvtier::detail
