#include "engine/worker.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

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

void run_worker(Scheduler& scheduler, const IoContext& io, const WorkerPlacement& placement) {
  place(placement);
  WorkerContext worker(io);
  Batch batch;
  while (scheduler.next_batch(placement.role, batch)) {
    run_blocks(io, worker, batch.is_load, batch.ops, batch.size, batch.ready(), batch.results);
    scheduler.finish_batch(batch);
  }
}

}  // namespace kvtier::detail
