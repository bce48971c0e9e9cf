#include "io/ring.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

namespace kvtier::detail {
namespace {

// IORING_NOP_INJECT_RESULT (kernel 6.10) is newer than the headers this builds against: a NOP
// with this flag in nop_flags (the union that holds rw_flags) completes with sqe->len as its
// result.
constexpr unsigned kNopInjectResult = 1U << 0;

// IORING_RSRC_REGISTER_SPARSE (kernel 5.19) may be newer than the headers too.
#ifdef IORING_RSRC_REGISTER_SPARSE
constexpr unsigned kRegisterSparse = IORING_RSRC_REGISTER_SPARSE;
#else
constexpr unsigned kRegisterSparse = 1U << 0;
#endif

std::atomic<SubmitFilter> g_filter{nullptr};
std::atomic<void*> g_filter_arg{nullptr};

int sys_setup(unsigned entries, io_uring_params* p) noexcept {
  return static_cast<int>(::syscall(__NR_io_uring_setup, entries, p));
}

int sys_enter(int fd, unsigned submit, unsigned wait, unsigned flags) noexcept {
  return static_cast<int>(::syscall(__NR_io_uring_enter, fd, submit, wait, flags, nullptr, 0));
}

int sys_register(int fd, unsigned opcode, const void* arg, unsigned count) noexcept {
  return static_cast<int>(::syscall(__NR_io_uring_register, fd, opcode, arg, count));
}

// Turns `sqe` into a NOP that completes with `result`, keeping its link flags and user data.
void inject(io_uring_sqe& sqe, int result) noexcept {
  const __u64 user_data = sqe.user_data;
  const __u8 flags = sqe.flags;
  std::memset(&sqe, 0, sizeof(sqe));
  sqe.opcode = IORING_OP_NOP;
  sqe.flags = flags;
  sqe.user_data = user_data;
  sqe.rw_flags = static_cast<__kernel_rwf_t>(kNopInjectResult);
  sqe.len = static_cast<__u32>(result);
}

// Whether an injected byte count is less than the read or write asked for (a full count keeps
// the chain going, as a real one does). Other opcodes have no count to compare: any counts.
bool short_count(const io_uring_sqe& sqe, int result) noexcept {
  if (sqe.opcode == IORING_OP_READ_FIXED || sqe.opcode == IORING_OP_WRITE_FIXED)
    return static_cast<std::size_t>(result) < sqe.len;
  if (sqe.opcode != IORING_OP_READV && sqe.opcode != IORING_OP_WRITEV) return true;
  const auto* iov = reinterpret_cast<const iovec*>(sqe.addr);
  std::size_t want = 0;
  for (unsigned i = 0; i < sqe.len; ++i) want += iov[i].iov_len;
  return static_cast<std::size_t>(result) < want;
}

}  // namespace

const unsigned kRequiredOpcodes[] = {IORING_OP_READV, IORING_OP_WRITEV, IORING_OP_FSYNC,
                                     IORING_OP_CLOSE};
const unsigned kRequiredOpcodeCount = sizeof(kRequiredOpcodes) / sizeof(kRequiredOpcodes[0]);

Ring::~Ring() {
  unmap();
  if (fd_ >= 0) ::close(fd_);
}

void Ring::unmap() noexcept {
  if (sqes_ != nullptr) ::munmap(sqes_, sqes_size_);
  if (cq_map_ != nullptr && cq_map_ != sq_map_) ::munmap(cq_map_, cq_map_size_);
  if (sq_map_ != nullptr) ::munmap(sq_map_, sq_map_size_);
  sqes_ = nullptr;
  cq_map_ = sq_map_ = nullptr;
}

int Ring::init(unsigned entries) noexcept {
  io_uring_params p;
  std::memset(&p, 0, sizeof(p));
  // SUBMIT_ALL: an entry the kernel refuses at submission does not hold back the rest of the
  // batch (each still gets its completion). Kernels before 5.18 refuse the flag: go without.
  p.flags = IORING_SETUP_SUBMIT_ALL;
  int fd = sys_setup(entries, &p);
  if (fd < 0 && errno == EINVAL) {
    std::memset(&p, 0, sizeof(p));
    fd = sys_setup(entries, &p);
  }
  if (fd < 0) return errno;
  fd_ = fd;
  sq_entries_ = p.sq_entries;

  sq_map_size_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  cq_map_size_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
  if (single) sq_map_size_ = cq_map_size_ = std::max(sq_map_size_, cq_map_size_);
  void* sq = ::mmap(nullptr, sq_map_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                    IORING_OFF_SQ_RING);
  if (sq == MAP_FAILED) return errno;
  sq_map_ = sq;
  if (single) {
    cq_map_ = sq_map_;
  } else {
    void* cq = ::mmap(nullptr, cq_map_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                      IORING_OFF_CQ_RING);
    if (cq == MAP_FAILED) return errno;
    cq_map_ = cq;
  }
  sqes_size_ = p.sq_entries * sizeof(io_uring_sqe);
  void* sqes = ::mmap(nullptr, sqes_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                      IORING_OFF_SQES);
  if (sqes == MAP_FAILED) return errno;
  sqes_ = static_cast<io_uring_sqe*>(sqes);

  auto* sqb = static_cast<unsigned char*>(sq_map_);
  sq_head_ = reinterpret_cast<unsigned*>(sqb + p.sq_off.head);
  sq_tail_ = reinterpret_cast<unsigned*>(sqb + p.sq_off.tail);
  sq_mask_ = *reinterpret_cast<unsigned*>(sqb + p.sq_off.ring_mask);
  sq_array_ = reinterpret_cast<unsigned*>(sqb + p.sq_off.array);
  auto* cqb = static_cast<unsigned char*>(cq_map_);
  cq_head_ = reinterpret_cast<unsigned*>(cqb + p.cq_off.head);
  cq_tail_ = reinterpret_cast<unsigned*>(cqb + p.cq_off.tail);
  cq_mask_ = *reinterpret_cast<unsigned*>(cqb + p.cq_off.ring_mask);
  cqes_ = reinterpret_cast<io_uring_cqe*>(cqb + p.cq_off.cqes);
  sqe_tail_ = sqe_head_ = *sq_tail_;

  // The probe names what this kernel can do; kernels before 5.6 have no probe (EINVAL) and
  // none of the opcodes either, which leaves every entry unsupported.
  // The probe's buffer is on the stack (about 2 KiB): init() is noexcept and must not
  // allocate.
  alignas(io_uring_probe) unsigned char probe_memory[sizeof(io_uring_probe) +
                                                     256 * sizeof(io_uring_probe_op)] = {};
  auto* probe = reinterpret_cast<io_uring_probe*>(probe_memory);
  if (sys_register(fd_, IORING_REGISTER_PROBE, probe, 256) == 0) {
    for (unsigned i = 0; i < probe->ops_len && i < 256; ++i)
      if (probe->ops[i].flags & IO_URING_OP_SUPPORTED) supported_[probe->ops[i].op] = 1;
  }
  return 0;
}

bool Ring::supports(unsigned opcode) const noexcept {
  return opcode < 256 && supported_[opcode] != 0;
}

bool Ring::fixed_buffer(std::size_t slots, std::size_t index, std::uint64_t id, void* data,
                        std::size_t size) noexcept {
  if (!table_tried_) {
    table_tried_ = true;
    if (!supports(IORING_OP_READ_FIXED) || !supports(IORING_OP_WRITE_FIXED)) return false;
    // The kernel's limit on the table (IORING_MAX_REG_BUFFERS): later slots go by address.
    slots = std::min<std::size_t>(slots, 1U << 14);
    io_uring_rsrc_register table;
    std::memset(&table, 0, sizeof(table));
    table.nr = static_cast<__u32>(slots);
    table.flags = kRegisterSparse;
    try {
      slot_ids_.assign(slots, 0);
      slot_registered_.assign(slots, false);
    } catch (...) {
      slot_ids_.clear();
      return false;
    }
    if (sys_register(fd_, IORING_REGISTER_BUFFERS2, &table, sizeof(table)) != 0) {
      slot_ids_.clear();
      slot_registered_.clear();
    }
  }
  if (index >= slot_ids_.size()) return false;
  if (slot_ids_[index] == id) return slot_registered_[index];
  iovec buffer{data, size};
  io_uring_rsrc_update2 update;
  std::memset(&update, 0, sizeof(update));
  update.offset = static_cast<__u32>(index);
  update.data = reinterpret_cast<__u64>(&buffer);
  update.nr = 1;
  slot_ids_[index] = id;
  // Between batches no request uses the slot (the kernel would keep its old buffer alive until
  // it finished anyway), and within one batch every block holds a different buffer.
  slot_registered_[index] =
      sys_register(fd_, IORING_REGISTER_BUFFERS_UPDATE, &update, sizeof(update)) == 1;
  return slot_registered_[index];
}

io_uring_sqe* Ring::get_sqe() noexcept {
  const unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
  if (sqe_tail_ - head >= sq_entries_) return nullptr;
  io_uring_sqe* sqe = &sqes_[sqe_tail_ & sq_mask_];
  ++sqe_tail_;
  std::memset(sqe, 0, sizeof(*sqe));
  return sqe;
}

// Moves every entry taken since the last call into the submission array, through the test
// seam when one is set, and publishes the new tail. Returns how many the kernel has not yet
// consumed.
unsigned Ring::publish_entries() noexcept {
  const SubmitFilter filter = g_filter.load(std::memory_order_acquire);
  unsigned tail = *sq_tail_;
  bool cancel_next = false;
  for (; sqe_head_ != sqe_tail_; ++sqe_head_, ++tail) {
    io_uring_sqe& sqe = sqes_[sqe_head_ & sq_mask_];
    if (cancel_next) {
      inject(sqe, -ECANCELED);  // breaks the rest of the chain, as the kernel would
      cancel_next = false;
    } else if (filter != nullptr) {
      cancel_next = apply_filter(filter, sqe);
    }
    sq_array_[tail & sq_mask_] = sqe_head_ & sq_mask_;
  }
  __atomic_store_n(sq_tail_, tail, __ATOMIC_RELEASE);
  return tail - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
}

// The test seam for one entry. Returns whether the next entry of its chain must be cancelled.
bool Ring::apply_filter(SubmitFilter filter, io_uring_sqe& sqe) noexcept {
  int result = 0;
  if (!filter(sqe, result, g_filter_arg.load(std::memory_order_relaxed))) return false;
  // A NOP with a byte count does not break a link, but a short read or write does: the
  // kernel would cancel the next linked entry (and with it the rest of the chain).
  const bool breaks_link = (sqe.flags & IOSQE_IO_LINK) != 0 && (sqe.flags & IOSQE_IO_HARDLINK) == 0;
  if (sqe.opcode == IORING_OP_CLOSE) {
    // A close that reports an error has released the descriptor all the same: the real
    // close runs (in its place in the chain) and only its result is rewritten.
    try {
      rewrites_.push_back({sqe.user_data, result});
    } catch (const std::bad_alloc&) {
      // A test seam only: out of memory, the close keeps its real result.
    }
    return breaks_link;
  }
  const bool cancel_next = result >= 0 && breaks_link && short_count(sqe, result);
  inject(sqe, result);
  return cancel_next;
}

int Ring::submit_and_wait(unsigned wait) noexcept {
  // What the kernel has not consumed yet, counted from the ring itself: after an error or a
  // partial submission the next call offers exactly the rest.
  const unsigned to_submit = publish_entries();
  const unsigned flags = wait > 0 ? IORING_ENTER_GETEVENTS : 0;
  const int n = sys_enter(fd_, to_submit, wait, flags);
  if (n < 0) return errno;
  // The kernel took nothing and said nothing (no room for completions): transient.
  if (n == 0 && to_submit > 0) return EBUSY;
  return 0;
}

// Not noexcept: the reason is a string (an allocation failure reaches the engine's constructor).
int probe_io_uring(std::string& reason) {
  Ring ring;
  if (int e = ring.init(4)) {
    reason = std::string("io_uring_setup failed: ") + std::strerror(e) +
             (e == EPERM    ? " (disabled by sysctl kernel.io_uring_disabled or a seccomp filter)"
              : e == ENOSYS ? " (kernel without io_uring)"
                            : "");
    return e;
  }
  for (unsigned i = 0; i < kRequiredOpcodeCount; ++i) {
    if (!ring.supports(kRequiredOpcodes[i])) {
      reason = "io_uring lacks opcode " + std::to_string(kRequiredOpcodes[i]) +
               " (IORING_REGISTER_PROBE)";
      return EOPNOTSUPP;
    }
  }
  return 0;
}

void set_submit_filter(SubmitFilter filter, void* arg) noexcept {
  g_filter_arg.store(arg, std::memory_order_relaxed);
  g_filter.store(filter, std::memory_order_release);
}

bool nop_injection_supported() noexcept {
  Ring ring;
  if (ring.init(2) != 0) return false;
  io_uring_sqe* sqe = ring.get_sqe();
  sqe->opcode = IORING_OP_NOP;
  sqe->rw_flags = static_cast<__kernel_rwf_t>(kNopInjectResult);
  sqe->len = static_cast<__u32>(-EIO);
  if (ring.submit_and_wait(1) != 0) return false;
  int res = 0;
  ring.reap([&](__u64, int r) { res = r; });
  return res == -EIO;
}

}  // namespace kvtier::detail
