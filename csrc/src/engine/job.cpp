#include "engine/job.hpp"

#include <stdexcept>
#include <string>
#include <string_view>

#include <kvtier/format.hpp>

namespace kvtier::detail {

namespace {

// Whether the last component of `path` ends in ".tmp", as every tmp file name does
// (tmp_file_name()): what eviction keeps for reuse, never a block file.
bool named_like_a_tmp_file(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string_view name =
      std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
  return name.size() > 4 && name.substr(name.size() - 4) == ".tmp";
}

}  // namespace

bool check_blocks(const std::vector<BlockOp>& blocks, Direction direction, bool cuda_enabled) {
  bool any_device = false;
  for (const BlockOp& op : blocks) {
    if (op.path.empty()) throw std::invalid_argument("block path must not be empty");
    if (direction == Direction::kLoad && !op.recycle.empty())
      throw std::invalid_argument("only a store can recycle a file: " + op.path);
    // Only a file eviction kept under a tmp name: never a block file of another key.
    if (!op.recycle.empty() && !named_like_a_tmp_file(op.recycle))
      throw std::invalid_argument("a file to recycle must have a tmp file name: " + op.recycle);
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
