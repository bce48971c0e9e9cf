#pragma once

#include <vector>

#include "engine/scheduler.hpp"
#include "io/block_io.hpp"

namespace kvtier::detail {

/// Where and how a worker thread runs.
struct WorkerPlacement {
  WorkerRole role = WorkerRole::kStoreFirst;
  int nice = 0;           ///< applied to the thread (0: left as it is)
  std::vector<int> cpus;  ///< affinity (empty: left as it is)
};

/// The body of one worker thread: names the thread, applies its placement, then takes
/// batches from `scheduler` and runs them on the I/O engine until the scheduler stops. Block
/// operations never throw (their failures are results); only the worker's scratch pages,
/// allocated once at start, can, and that ends the process as any exception on a thread does.
void run_worker(Scheduler& scheduler, const IoContext& io, const WorkerPlacement& placement);

}  // namespace kvtier::detail
