#include "io/worker_context.hpp"

#include <new>

#include "io/io_uring_engine.hpp"

namespace kvtier::detail {

Ring* WorkerContext::ring() noexcept {
  if (ring_tried_ || ctx_.io_engine != IoEngine::kIoUring) return ring_.get();
  ring_tried_ = true;
  try {
    auto ring = std::make_unique<Ring>();
    if (ring->init(kRingEntries) != 0) return nullptr;
    batch_pages = AlignedBuffer(kMaxBatchBlocks * kRingPagesPerBlock);
    ring_ = std::move(ring);
  } catch (const std::bad_alloc&) {
  }
  return ring_.get();
}

}  // namespace kvtier::detail
