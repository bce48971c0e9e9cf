#pragma once

#include <linux/io_uring.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::detail {

/// One io_uring instance, spoken to through the raw system calls (io_uring_setup, _enter,
/// _register) so that neither the build nor the wheel needs liburing. Owned and used by one
/// thread (a worker): nothing here is synchronised.
///
/// Submission publishes the SQ tail with a release store (the kernel reads the SQEs after
/// seeing it); reaping reads the CQ tail with an acquire load (the CQEs were written before
/// it moved) and hands slots back with a release store of the CQ head.
class Ring {
 public:
  Ring() = default;
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  /// Sets the ring up with room for `entries` submissions. Returns 0 or the errno the kernel
  /// answered (EPERM: kernel.io_uring_disabled or a seccomp filter; ENOSYS: no io_uring).
  int init(unsigned entries) noexcept;

  bool ready() const noexcept { return fd_ >= 0; }
  unsigned entries() const noexcept { return sq_entries_; }

  /// The next free submission entry, zero-filled; nullptr when the queue is full.
  io_uring_sqe* get_sqe() noexcept;

  /// Entries taken by get_sqe() and not yet submitted.
  unsigned pending() const noexcept { return sqe_tail_ - sqe_head_; }

  /// Publishes every entry taken since the last call, then makes one io_uring_enter that
  /// submits whatever the kernel has not consumed yet and waits until `wait` completions are
  /// available. Returns 0, or an errno: EINTR, EAGAIN and EBUSY are transient (reap what
  /// completed and call again; see is_transient_enter_error), anything else means the ring is
  /// unusable. "The kernel consumed nothing, without an error" is reported as EBUSY.
  int submit_and_wait(unsigned wait) noexcept;

  /// Entries published but not consumed by the kernel; a ring that is never entered again
  /// never runs them (no SQPOLL), so they can be abandoned with it.
  unsigned unconsumed() const noexcept {
    return *sq_tail_ - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
  }

  /// Calls `fn(user_data)` for each entry published but not consumed by the kernel.
  template <typename Fn>
  void for_each_unconsumed(Fn&& fn) const noexcept {
    const unsigned tail = *sq_tail_;
    for (unsigned i = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE); i != tail; ++i)
      fn(sqes_[sq_array_[i & sq_mask_]].user_data);
  }

  /// Calls `fn(user_data, res)` for each available completion and returns how many.
  template <typename Fn>
  unsigned reap(Fn&& fn) noexcept {
    unsigned seen = 0;
    unsigned head = *cq_head_;
    const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    for (; head != tail; ++head, ++seen) {
      const io_uring_cqe& cqe = cqes_[head & cq_mask_];
      int res = cqe.res;
      for (std::size_t i = 0; i < rewrites_.size(); ++i) {
        if (rewrites_[i].user_data != cqe.user_data) continue;
        res = rewrites_[i].result;
        rewrites_.erase(rewrites_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      fn(cqe.user_data, res);
    }
    __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
    return seen;
  }

  /// Whether the kernel supports `opcode` (IORING_REGISTER_PROBE).
  bool supports(unsigned opcode) const noexcept;

  /// Fixed buffers for IORING_OP_READ_FIXED/WRITE_FIXED, filled slot by slot: whether slot
  /// `index` holds [data, data + size), the buffer `id` names (ids are never reused), after
  /// registering it there if it does not yet. The first call registers a sparse table of
  /// `slots` entries (IORING_REGISTER_BUFFERS2 with IORING_RSRC_REGISTER_SPARSE). False where
  /// the buffer must go by address instead: no table (kernels before 5.19), `index` beyond it,
  /// or the kernel refused the buffer (ENOMEM over RLIMIT_MEMLOCK without CAP_IPC_LOCK); a
  /// refused buffer is not offered to the kernel again.
  bool fixed_buffer(std::size_t slots, std::size_t index, std::uint64_t id, void* data,
                    std::size_t size) noexcept;

 private:
  void unmap() noexcept;
  unsigned publish_entries() noexcept;
  bool apply_filter(bool (*filter)(const io_uring_sqe&, int&, void*), io_uring_sqe& sqe) noexcept;

  int fd_ = -1;
  unsigned sq_entries_ = 0;
  void* sq_map_ = nullptr;
  std::size_t sq_map_size_ = 0;
  void* cq_map_ = nullptr;  // == sq_map_ with IORING_FEAT_SINGLE_MMAP
  std::size_t cq_map_size_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  std::size_t sqes_size_ = 0;
  unsigned* sq_head_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned* sq_array_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned sqe_tail_ = 0;  // entries handed out by get_sqe(), published by submit_and_wait()
  unsigned sqe_head_ = 0;  // entries already published
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
  unsigned char supported_[256] = {};  // by opcode, from IORING_REGISTER_PROBE
  struct Rewrite {
    std::uint64_t user_data;
    int result;
  };
  std::vector<Rewrite> rewrites_;  // completions the test seam reports differently
  // The fixed-buffer table: per slot the id of the buffer offered there (0: none), and
  // whether the kernel took it.
  bool table_tried_ = false;
  std::vector<std::uint64_t> slot_ids_;
  std::vector<bool> slot_registered_;
};

/// Whether an errno from io_uring_enter may go away on its own: a signal (EINTR), or the
/// kernel short of memory or of room for completions for a moment (EAGAIN, EBUSY).
inline bool is_transient_enter_error(int error) noexcept {
  return error == EINTR || error == EAGAIN || error == EBUSY;
}

/// The opcodes the block operations need (read, write, fsync, close).
extern const unsigned kRequiredOpcodes[];
extern const unsigned kRequiredOpcodeCount;

/// Whether this process may use io_uring for block files: sets up a small ring and probes the
/// required opcodes. Returns 0, or an errno with `reason` saying what refused it.
/// Throws std::bad_alloc only (making `reason`).
int probe_io_uring(std::string& reason);

/// Test-only seam at the system-call boundary. When set, every submission entry passes
/// through `filter` just before the kernel sees it; a filter that returns true (and sets
/// `result`: a negative errno, or a byte count for a read or write) turns the entry into a NOP
/// that the kernel itself completes with that result (IORING_NOP_INJECT_RESULT), so a failure
/// breaks a linked chain and cancels the rest exactly as a real one does; a short count on a
/// linked entry cancels the next one, as a real short read or write does, and a full count of
/// a read or write lets the chain go on (a write the file system could not make inline); a close
/// still runs (a failing close(2) releases the descriptor too), its completion carries the
/// injected result and the next linked entry is cancelled. Every opcode the engine submits
/// passes through it, fixed-buffer reads and writes (READ_FIXED/WRITE_FIXED) included, so a
/// filter that only counts (returns false) shows which way the blocks went. Null (the
/// default) turns the seam off. Set it while no engine is running.
using SubmitFilter = bool (*)(const io_uring_sqe& sqe, int& result, void* arg);
void set_submit_filter(SubmitFilter filter, void* arg) noexcept;

/// Whether the kernel completes a NOP with an injected result (what the seam relies on).
bool nop_injection_supported() noexcept;

}  // namespace kvtier::detail
