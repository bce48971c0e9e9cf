#include "engine/worker.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <optional>

#include "io/block_file.hpp"
#include "io/worker_context.hpp"

namespace kvtier::detail {
namespace {

void place(const WorkerPlacement& placement) {
  ::pthread_setname_np(::pthread_self(),
                       placement.role == WorkerRole::kStoreFirst ? "kvtier-store" : "kvtier-load");
  // Linux applies nice per thread (a tid is a process id to setpriority). Raising it needs no
  // privilege; it is best effort anyway: a refusal only costs the scheduler loop some CPU.
  if (placement.nice > 0)
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), placement.nice);
  if (!placement.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : placement.cpus)
      if (cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
    ::sched_setaffinity(0, sizeof(set), &set);  // best effort: a refusal only costs locality
  }
}

}  // namespace

// The worker's own buffers (WorkerContext) are allocated on its thread, where a bad_alloc
// would end the process: a worker that cannot have them fails its batches with ENOMEM and
// tries again at the next one, so every job is still reported. next_batch() throws only what
// std::mutex and std::condition_variable throw for a broken mutex (a bug, never the storage).
void run_worker(Scheduler& scheduler, const IoContext& io, const WorkerPlacement& placement) {
  place(placement);
  std::optional<WorkerContext> worker;
  Batch batch;
  while (scheduler.next_batch(placement.role, batch)) {
    if (!worker) {
      try {
        worker.emplace(io);
      } catch (const std::bad_alloc&) {
      }
    }
    if (worker) {
      run_blocks(io, *worker, batch.is_load, batch.ops, batch.size, batch.ready(), batch.results);
    } else {
      for (std::size_t i = 0; i < batch.size; ++i)
        batch.results[i] = unallocated_failure(ENOMEM, batch.is_load ? "load" : "store",
                                               "out of memory for the worker's buffers");
    }
    scheduler.finish_batch(batch);
  }
}

}  // namespace kvtier::detail
