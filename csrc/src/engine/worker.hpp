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

/// How a worker's body ended.
enum class WorkerExit {
  kStopped,    ///< the scheduler stopped and nothing was left for it
  kAbandoned,  ///< the watchdog timed its batch out; it returned from the kernel since
};

/// The body of one worker thread: names the thread, applies its placement, then takes
/// batches from `scheduler` and runs them on the I/O engine until the scheduler stops. Block
/// operations never throw (their failures are results). With io_timeout_s > 0 its batches
/// run on its own buffers (io/owned_payload.hpp); when the watchdog times one out, this
/// returns kAbandoned as soon as the kernel returns, having touched neither `scheduler` nor
/// the batch's jobs since, and everything it used since lives in `io` or on its own stack.
/// `owner` identifies the worker in Abandoned records; `abandoned_blocks` is set to the
/// abandoned batch's size.
WorkerExit run_worker(Scheduler& scheduler, const IoContext& io, const WorkerPlacement& placement,
                      void* owner, std::size_t& abandoned_blocks);

}  // namespace kvtier::detail
