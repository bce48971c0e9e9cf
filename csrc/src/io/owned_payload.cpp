#include "io/owned_payload.hpp"

#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include <kvtier/format.hpp>

#include "device/segment_copier.hpp"
#include "io/worker_context.hpp"

namespace kvtier::detail {

OwnedPayloads::~OwnedPayloads() {
  unregister();
}

void OwnedPayloads::unregister() noexcept {
  if (registered_with_ != nullptr) registered_with_->cudaHostUnregister(arena_.data());
  registered_with_ = nullptr;
}

void OwnedPayloads::grow(const IoContext& ctx, std::size_t bytes) {
  if (arena_.size() >= bytes) return;
  // Whole huge pages (see the class): never a 4 KiB-page tail behind the last 2 MiB, and a
  // batch of small blocks shares huge pages too. At least 2 MiB per worker that ran a batch
  // under a deadline, which the engine's staging buffers already cost per buffer.
  const std::size_t huge = (bytes + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  AlignedBuffer bigger(huge);  // throws before anything changes
  unregister();
  arena_ = std::move(bigger);
  // Pinned where the engine moves device memory; unpinned memory still works (the runtime
  // stages it itself), only slower, so a refused registration is no error.
  if (ctx.cuda != nullptr) {
    if (ctx.cuda->cudaHostRegister(arena_.data(), arena_.size(), cuda::kHostRegisterPortable) ==
        cuda::kSuccess)
      registered_with_ = ctx.cuda;
    else
      ctx.cuda->cudaGetLastError();
  }
}

void OwnedPayloads::prepare(const IoContext& ctx, const BlockOp* const* ops, std::size_t n) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) total += align_up(ops[i]->payload_length());
  grow(ctx, total);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < n; ++i) {
    BlockOp& own = ops_[i];
    own.path = ops[i]->path;  // the caller's op belongs to its job, which may be freed
    own.key = ops[i]->key;
    own.recycle = ops[i]->recycle;
    own.segments.clear();
    own.length = ops[i]->payload_length();
    // A zero-length block still needs an address that is not null (check_blocks' rule).
    own.data = arena_.size() > 0 ? arena_.data() + offset : static_cast<void*>(&own);
    offset += align_up(own.length);
  }
}

void OwnedPayloads::copy_ops(const BlockOp* const* ops, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) ops_[i] = *ops[i];  // assignment keeps the room
}

namespace {

// The caller's payload as segments (a contiguous one as a single host segment).
const std::vector<Segment>& caller_segments(const BlockOp& op, std::vector<Segment>& scratch) {
  if (!op.segments.empty()) return op.segments;
  scratch.assign(1, Segment{op.data, op.length, MemoryKind::kHost});
  return scratch;
}

// Host memory, segment after segment, with the CRC32C of the bytes taken in the same pass.
// A load goes out to the caller's memory around the caches (crc32c_copy_uncached): its source
// was just written by the device (or the kernel) into a buffer the size of the batch, and
// what reads the caller's rows next is usually a device copy, so the cache holds nothing
// worth the memory traffic of fetching each line of the rows before overwriting it.
std::uint32_t copy_host_with_crc(const std::vector<Segment>& segments, unsigned char* owned,
                                 bool into_owned) noexcept {
  std::uint32_t crc = 0;
  std::size_t at = 0;
  for (const Segment& seg : segments) {
    auto* mine = owned + at;
    crc = into_owned ? crc32c_copy(crc, mine, seg.address, seg.length)
                     : crc32c_copy_uncached(crc, seg.address, mine, seg.length);
    at += seg.length;
  }
  return crc;
}

// One step, host (memcpy, or the fused copy and CRC when `crc` is wanted) or device (CUDA
// copies after `ready`, done when this returns; the CRC is then taken from `owned`).
StepError copy_between(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       unsigned char* owned, bool into_owned, cuda::Event ready,
                       std::uint32_t* crc) noexcept {
  try {
    if (crc != nullptr) *crc = 0;  // the CRC32C of no bytes
    std::vector<Segment> scratch;
    const std::vector<Segment>& segments = caller_segments(op, scratch);
    const std::size_t n = op.payload_length();
    if (n == 0) return {};
    if (crc != nullptr && payload_in_host_memory(op)) {
      *crc = copy_host_with_crc(segments, owned, into_owned);
      return {};
    }
    StepError e = copy_staged(ctx.cuda, worker.stream, segments, owned, n, into_owned, ready);
    if (!e && crc != nullptr) *crc = crc32c(owned, n);
    return e;
  } catch (const std::bad_alloc&) {
    return {ENOMEM, into_owned ? "copy_in" : "copy_out"};
  }
}

}  // namespace

bool payload_in_host_memory(const BlockOp& op) noexcept {
  for (const Segment& seg : op.segments)
    if (seg.kind != MemoryKind::kHost) return false;
  return true;
}

StepError copy_into_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                          unsigned char* owned, cuda::Event ready, std::uint32_t* crc) noexcept {
  StepError e = copy_between(ctx, worker, op, owned, /*into_owned=*/true, ready, crc);
  const std::size_t n = op.payload_length();
  if (!e) std::memset(owned + n, 0, align_up(n) - n);  // the page's rest goes to the file
  return e;
}

StepError copy_out_of_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                            const unsigned char* owned, cuda::Event ready,
                            std::uint32_t* crc) noexcept {
  // Both copy paths only read the owned side when copying out of it.
  return copy_between(ctx, worker, op, const_cast<unsigned char*>(owned), /*into_owned=*/false,
                      ready, crc);
}

}  // namespace kvtier::detail
