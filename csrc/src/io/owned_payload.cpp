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
  AlignedBuffer bigger(bytes);  // throws before anything changes
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
    own.segments.clear();
    own.length = ops[i]->payload_length();
    // A zero-length block still needs an address that is not null (check_blocks' rule).
    own.data = arena_.size() > 0 ? arena_.data() + offset : static_cast<void*>(&own);
    offset += align_up(own.length);
  }
}

namespace {

// The caller's payload as segments (a contiguous one as a single host segment).
const std::vector<Segment>& caller_segments(const BlockOp& op, std::vector<Segment>& scratch) {
  if (!op.segments.empty()) return op.segments;
  scratch.assign(1, Segment{op.data, op.length, MemoryKind::kHost});
  return scratch;
}

// One step, host (memcpy) or device (CUDA copies after `ready`, done when this returns).
StepError copy_between(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                       unsigned char* owned, bool into_owned, cuda::Event ready) noexcept {
  try {
    std::vector<Segment> scratch;
    const std::vector<Segment>& segments = caller_segments(op, scratch);
    const std::size_t n = op.payload_length();
    if (n == 0) return {};
    return copy_staged(ctx.cuda, worker.stream, segments, owned, n, into_owned, ready);
  } catch (const std::bad_alloc&) {
    return {ENOMEM, into_owned ? "copy_in" : "copy_out"};
  }
}

}  // namespace

StepError copy_into_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                          unsigned char* owned, cuda::Event ready) noexcept {
  StepError e = copy_between(ctx, worker, op, owned, /*into_owned=*/true, ready);
  const std::size_t n = op.payload_length();
  if (!e) std::memset(owned + n, 0, align_up(n) - n);  // the page's rest goes to the file
  return e;
}

StepError copy_out_of_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                            const unsigned char* owned, cuda::Event ready) noexcept {
  // copy_staged only reads the staging side when copying out of it.
  return copy_between(ctx, worker, op, const_cast<unsigned char*>(owned), /*into_owned=*/false,
                      ready);
}

}  // namespace kvtier::detail
