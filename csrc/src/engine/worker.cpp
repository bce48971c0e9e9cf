#include "engine/worker.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "fs/memory_fs.hpp"
#include "io/block_file.hpp"
#include "io/owned_payload.hpp"
#include "io/psync_engine.hpp"
#include "io/worker_context.hpp"

namespace kvtier::detail {
namespace {

// struct sched_attr of sched_setattr(2), its first version (48 bytes, Linux 3.14); declared
// here because only newer C libraries declare it, and under that name.
struct SchedAttr {
  std::uint32_t size;
  std::uint32_t sched_policy;
  std::uint64_t sched_flags;
  std::int32_t sched_nice;
  std::uint32_t sched_priority;
  std::uint64_t sched_runtime;  // for SCHED_OTHER/BATCH/IDLE: the EEVDF slice (Linux 6.12)
  std::uint64_t sched_deadline;
  std::uint64_t sched_period;
};

// A store worker is throughput work that nothing waits for, so the engine's threads and the
// load workers must get the CPU the moment they wake, not at the next tick (up to 4 ms at
// HZ=250). A low nice value alone does not do that: EEVDF lets the running task finish its
// slice ("run to parity") unless the waking task asks for a shorter slice than the running
// one, and every thread asks for the default. Asking for a long slice here makes every
// default-slice waker preempt a store worker at once (docs/PERFORMANCE.md section 18). The
// slice is a latency request, not a share: the CPU is still divided by nice. Kernels before
// 6.12 ignore sched_runtime for these policies; best effort, like the nice value.
constexpr std::uint64_t kStoreWorkerSliceNs = 20'000'000;
static_assert(sizeof(SchedAttr) == 48, "SCHED_ATTR_SIZE_VER0");

void lengthen_slice() {
  SchedAttr attr{};
  if (::syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return;
  if (attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH &&
      attr.sched_policy != SCHED_IDLE)
    return;  // real-time or deadline: a slice means nothing there
  attr.size = sizeof attr;  // the nice value and the policy read back are set again unchanged
  attr.sched_runtime = kStoreWorkerSliceNs;
  ::syscall(SYS_sched_setattr, 0, &attr, 0);
}

void place(const WorkerPlacement& placement) {
  ::pthread_setname_np(::pthread_self(),
                       placement.role == WorkerRole::kStoreFirst ? "kvtier-store" : "kvtier-load");
  // Linux applies nice per thread (a tid is a process id to setpriority). Raising it needs no
  // privilege; it is best effort anyway: a refusal only costs the scheduler loop some CPU.
  if (placement.nice > 0)
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), placement.nice);
  if (placement.role == WorkerRole::kStoreFirst) lengthen_slice();
  if (!placement.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : placement.cpus)
      if (cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
    ::sched_setaffinity(0, sizeof(set), &set);  // best effort: a refusal only costs locality
  }
}

}  // namespace

namespace {

// How a batch fared on the path that skips the arena for a file system of memory.
enum class FromMemory { kDone, kAbandoned, kNotMemory };

// A load batch under a deadline whose files hold only memory (fs/memory_fs.hpp): read straight
// into the caller's memory, as without a deadline, instead of into the arena and copied out.
// The deadline's invariant (after a job is reported, kvtier never touches its memory again)
// holds because the caller's memory is written only while the worker has claimed the batch,
// and the watchdog never times out a claimed batch: such a job is reported when the reads
// return, never before. What the deadline bounds is kept by the files: the opens (path
// resolution, any file system) run inside the kernel phase under the deadline, and only a
// file that holds only memory (RootMemory::holds) is read after the claim, where a read is a
// copy out of memory. The opens read the worker's copies of the ops (OwnedPayloads::copy_ops):
// once the watchdog has timed them out, the job is reported and may be freed while an open is
// still in the kernel.
//
// kNotMemory: some file is elsewhere (a file system mounted below the root, swap switched
// on, device memory to fill); the files are closed and the batch is left claimed, for the
// arena path to put back under its deadline. kAbandoned: the watchdog timed the opens out.
FromMemory load_from_memory(const IoContext& io, WorkerContext& worker, OwnedPayloads& owned,
                            Batch& batch) {
  const std::size_t n = batch.size;
  for (std::size_t i = 0; i < n; ++i)
    if (!payload_in_host_memory(*batch.ops[i])) return FromMemory::kNotMemory;
  try {
    owned.copy_ops(batch.ops, n);  // the opens read these: the job may be gone by their return
  } catch (const std::bad_alloc&) {
    return FromMemory::kNotMemory;  // the arena path says ENOMEM
  }
  OpenedLoad files[kMaxBatchBlocks];
  bool opened[kMaxBatchBlocks] = {};
  const bool root_now = io.root_memory.now();  // swap, asked once for the batch
  bool memory = true;
  batch.enter_kernel();
  for (std::size_t i = 0; i < n && memory; ++i) {
    opened[i] = open_load(io, owned.op(i), files[i], batch.results[i]);
    memory = !opened[i] || io.root_memory.holds(files[i].fd.get(), files[i].st, root_now);
  }
  if (!batch.claim()) return FromMemory::kAbandoned;
  if (!memory) {
    for (std::size_t i = 0; i < n; ++i) batch.results[i] = BlockResult();
    return FromMemory::kNotMemory;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!opened[i]) continue;  // its result says why (a missing block, a link, ...)
    files[i].memory_only = true;
    batch.results[i] = read_load(io, worker, owned.op(i), files[i], batch.ready());
    batch.results[i].from_memory_fs = batch.results[i].ok();
  }
  return FromMemory::kDone;
}

// A store batch under a deadline whose tmp files land on a file system of memory: written
// straight from the caller's memory, as without a deadline, instead of copied into the arena
// first. As for loads from memory, the caller's memory is read only while the worker has
// claimed the batch, which the watchdog never times out; what touches the file system (the
// directory, the tmp file's creation, the sync and the rename) runs under the deadline, before
// and after (after: a fresh one, for the writes may take longer than a deadline without the
// storage being at fault). A write into tmpfs or ramfs is a copy into memory. The kernel
// phases read the worker's copies of the ops, as loads from memory do.
//
// kNotMemory: some tmp file is elsewhere (a file system mounted below the root, swap switched
// on) or a payload is device memory; the tmp files are removed and the batch is left claimed,
// for the arena path. kAbandoned: the watchdog timed the batch out in a kernel phase.
FromMemory store_to_memory(const IoContext& io, WorkerContext& worker, Scheduler& scheduler,
                           OwnedPayloads& owned, Batch& batch) {
  const std::size_t n = batch.size;
  for (std::size_t i = 0; i < n; ++i)
    if (!payload_in_host_memory(*batch.ops[i])) return FromMemory::kNotMemory;
  try {
    owned.copy_ops(batch.ops, n);  // the kernel phases read these: the job may be gone
  } catch (const std::bad_alloc&) {
    return FromMemory::kNotMemory;  // the arena path says ENOMEM
  }
  OpenedStore files[kMaxBatchBlocks];
  bool opened[kMaxBatchBlocks] = {};
  const bool root_now = io.root_memory.now();
  bool memory = true;
  batch.enter_kernel();
  for (std::size_t i = 0; i < n && memory; ++i) {
    opened[i] = open_store(io, owned.op(i), files[i], batch.results[i]);
    memory = !opened[i] || io.root_memory.holds(files[i].file.fd.get(), files[i].st, root_now);
    files[i].memory_only = memory;
  }
  if (!memory) {
    for (std::size_t i = 0; i < n; ++i) {
      if (opened[i]) files[i].file.discard_tmp();  // still under the deadline: any file system
      batch.results[i] = BlockResult();
    }
  }
  const bool claimed = batch.claim();
  if (!claimed || !memory) {
    if (!claimed && memory)  // abandoned: its own files only, never the caller's memory
      for (std::size_t i = 0; i < n; ++i)
        if (opened[i]) files[i].file.discard_tmp();
    return claimed ? FromMemory::kNotMemory : FromMemory::kAbandoned;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!opened[i]) continue;  // its result says why
    batch.results[i] = write_store(io, worker, owned.op(i), files[i], batch.ready());
    opened[i] = batch.results[i].ok();
  }
  scheduler.reenter_kernel(batch);  // the syncs and renames: under a deadline again
  for (std::size_t i = 0; i < n; ++i) {
    if (!opened[i]) continue;
    batch.results[i] = publish_store(io, owned.op(i), files[i]);
    batch.results[i].from_memory_fs = batch.results[i].ok();
  }
  return batch.claim() ? FromMemory::kDone : FromMemory::kAbandoned;
}

// A batch under a deadline (EngineConfig::io_timeout_s > 0), on the worker's own buffers:
// stores copied in first, the I/O, then the claim; loads copied out only after it. Returns
// false when the watchdog timed the batch out first: the worker is abandoned then, and must
// touch neither the batch's jobs nor the caller's memory (it exits at once).
//
// The payload's CRC32C rides on the copies (CrcPlan): a store's is taken while it is copied
// in and goes into the header; a host load's is taken while it is copied out and compared
// with the header's before the block counts as loaded. Device loads are checked in the
// arena by the I/O engine before the copy, so only verified bytes reach device memory.
bool run_owned(const IoContext& io, WorkerContext& worker, Scheduler& scheduler,
               OwnedPayloads& owned, Batch& batch) {
  // Whether a memory path claimed the batch after its opens and handed it over: it goes back
  // into the kernel under a fresh deadline then, not what the opens left of the first.
  bool claimed = false;
  if (io.root_memory.possible()) {
    switch (batch.is_load ? load_from_memory(io, worker, owned, batch)
                          : store_to_memory(io, worker, scheduler, owned, batch)) {
      case FromMemory::kDone:
        return true;
      case FromMemory::kAbandoned:
        return false;
      case FromMemory::kNotMemory:
        claimed = batch.state.load(std::memory_order_relaxed) == BatchState::kClaimed;
        break;
    }
  }
  auto enter_kernel = [&] {
    if (claimed)
      scheduler.reenter_kernel(batch);
    else
      batch.enter_kernel();
  };
  const std::size_t n = batch.size;
  const char* what = batch.is_load ? "load" : "store";
  try {
    owned.prepare(io, batch.ops, n);
  } catch (const std::bad_alloc&) {
    for (std::size_t i = 0; i < n; ++i)
      batch.results[i] = unallocated_failure(ENOMEM, what, "out of memory for the owned buffers");
    enter_kernel();
    return batch.claim();
  }
  const bool want_crc = io.config->checksum == Checksum::kCrc32c;
  // Blocks whose copy-in failed are not run: `run[]` lists the ones that go to the kernel.
  const BlockOp* run_ops[kMaxBatchBlocks];
  BlockResult run_results[kMaxBatchBlocks];
  CrcPlan run_crc[kMaxBatchBlocks];
  std::size_t run_index[kMaxBatchBlocks];
  std::size_t n_run = 0;
  for (std::size_t i = 0; i < n; ++i) {
    CrcPlan plan;
    if (!batch.is_load) {
      StepError e = copy_into_owned(io, worker, *batch.ops[i], owned.payload(i), batch.ready(),
                                    want_crc ? &plan.crc : nullptr);
      if (e) {
        batch.results[i] = failure(e.error, e.operation, std::string(), std::move(e.message));
        continue;
      }
      plan.in_copy = want_crc;
    } else {
      plan.in_copy = want_crc && payload_in_host_memory(*batch.ops[i]);
    }
    run_index[n_run] = i;
    run_crc[n_run] = plan;
    run_ops[n_run++] = &owned.op(i);
  }
  enter_kernel();
  // The owned ops are host memory: the submitter's event matters only for the copy steps.
  run_blocks(io, worker, batch.is_load, run_ops, n_run, nullptr, run_results, run_crc);
  if (!batch.claim()) return false;
  bool mismatch[kMaxBatchBlocks] = {};
  bool any_mismatch = false;
  for (std::size_t k = 0; k < n_run && batch.is_load; ++k) {
    const std::size_t i = run_index[k];
    BlockResult& r = run_results[k];
    if (!r.ok()) continue;
    std::uint32_t crc = 0;
    StepError e = copy_out_of_owned(io, worker, *batch.ops[i], owned.payload(i), batch.ready(),
                                    r.crc_pending ? &crc : nullptr);
    if (e) {
      BlockResult f = failure(e.error, e.operation, std::string(), std::move(e.message));
      f.o_direct_fallback = r.o_direct_fallback;
      f.ring_retired_errno = r.ring_retired_errno;
      r = std::move(f);
    } else if (r.crc_pending && crc != r.expected_crc) {
      // The bytes are in the caller's memory already: harmless, for the job is not reported
      // yet and this block is reported failed, so the engine discards its slot.
      mismatch[k] = any_mismatch = true;
    }
  }
  if (any_mismatch) {
    // As the engine does with a checksum failure: the block fails with EBADMSG "verify" and
    // its file goes. Removing it touches the file system, so the batch goes back under its
    // deadline for that (its jobs are still unreported; only the worker writes the state
    // while it has claimed the batch, and the watchdog skips claimed batches).
    scheduler.reenter_kernel(batch);
    for (std::size_t k = 0; k < n_run; ++k) {
      if (!mismatch[k]) continue;
      BlockResult& r = run_results[k];
      const BlockOp& op = owned.op(run_index[k]);
      BlockResult f;
      try {
        f = failure(EBADMSG, "verify", op.path, "payload checksum mismatch");
        f.corrupt_removed = remove_corrupt_file(io, op, r.file_dev, r.file_ino);
      } catch (const std::bad_alloc&) {
        f = unallocated_failure(EBADMSG, "verify", "payload checksum mismatch");
      }
      f.o_direct_fallback = r.o_direct_fallback;
      f.ring_retired_errno = r.ring_retired_errno;
      r = std::move(f);
    }
    if (!batch.claim()) return false;
  }
  for (std::size_t k = 0; k < n_run; ++k) batch.results[run_index[k]] = std::move(run_results[k]);
  return true;
}

}  // namespace

// The worker's own buffers (WorkerContext) are allocated on its thread, where a bad_alloc
// would end the process: a worker that cannot have them fails its batches with ENOMEM and
// tries again at the next one, so every job is still reported. next_batch() throws only what
// std::mutex and std::condition_variable throw for a broken mutex (a bug, never the storage).
WorkerExit run_worker(Scheduler& scheduler, const IoContext& io, const WorkerPlacement& placement,
                      void* owner, std::size_t& abandoned_blocks) {
  place(placement);
  std::optional<WorkerContext> worker;
  OwnedPayloads owned;
  const bool deadline = io.config->io_timeout_s > 0;
  Batch batch;
  batch.owner = owner;
  while (scheduler.next_batch(placement.role, batch)) {
    if (!worker) {
      try {
        worker.emplace(io);
      } catch (const std::bad_alloc&) {
      }
    }
    if (!worker) {
      for (std::size_t i = 0; i < batch.size; ++i)
        batch.results[i] = unallocated_failure(ENOMEM, batch.is_load ? "load" : "store",
                                               "out of memory for the worker's buffers");
      if (deadline) {
        batch.enter_kernel();
        if (!batch.claim()) {
          abandoned_blocks = batch.size;
          return WorkerExit::kAbandoned;
        }
      }
    } else if (deadline) {
      if (!run_owned(io, *worker, scheduler, owned, batch)) {
        abandoned_blocks = batch.size;
        return WorkerExit::kAbandoned;
      }
    } else {
      run_blocks(io, *worker, batch.is_load, batch.ops, batch.size, batch.ready(), batch.results);
    }
    scheduler.finish_batch(batch);
  }
  return WorkerExit::kStopped;
}

}  // namespace kvtier::detail
