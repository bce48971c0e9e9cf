#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "engine/parked_loads.hpp"
#include "util/mpsc_queue.hpp"

namespace kvtier::detail {

using Clock = std::chrono::steady_clock;

/// A submitted job, from Engine::submit until pop_completions() delivers it.
///
/// Who touches what: until the job is published (Completions::publish) every field is
/// guarded by the scheduler's mutex (the outcome fields are written by finish_block, which
/// runs with it held). From the publication on, the job belongs to the consumer alone; the
/// completion queue's release/acquire pair makes the outcome visible to it.
struct Job {
  MpscNode node;  // first member: a node pointer is the job pointer (Completions)
  JobId id = 0;
  Direction direction = Direction::kLoad;
  std::vector<BlockOp> blocks;
  Clock::time_point submitted;

  // Outcome.
  std::vector<int> block_errnos;
  std::size_t remaining = 0;  // blocks not yet finished
  bool failed = false;        // some block failed; `error` holds the first failure
  // The first failure, as moved out of its BlockResult: recording it never allocates (the
  // scheduler does it in noexcept code); the JobError is made when the job is popped.
  struct FirstFailure {
    int errno_value = 0;
    const char* operation = "";
    std::string path;           // empty: blocks[block].path
    std::string message;        // empty: `note`, when set
    const char* note = nullptr;
    std::size_t block = 0;
  } error;
  std::uint64_t bytes = 0;
  double seconds = 0.0;

  // Scheduling state: the submission order (for drain()), the neighbours in the scheduler's
  // list of incomplete jobs, the next block a worker takes while the job is queued, and (loads
  // only) one parking link per block, allocated at submit.
  // A queued job's blocks from next_block on have not started; among them a nonzero
  // block_errnos entry marks one failed before it started (Scheduler::fail_unstarted), which
  // no worker may take: next_block never rests on one.
  std::uint64_t seq = 0;
  Job* older = nullptr;
  Job* newer = nullptr;
  std::size_t next_block = 0;
  std::vector<ParkedLoad> parking;

  // Submitted while the scheduler's mutex was held elsewhere: the next job in its inbox
  // (Scheduler::submit), written by the submitter before the job is pushed.
  Job* inbox_next = nullptr;

  // Popped but not yet delivered (a conversion threw); guarded by the consumer's mutex.
  Job* undelivered_next = nullptr;

  // Recorded on the submitter's stream for jobs over device memory; destroyed with the job.
  cuda::Event ready = nullptr;
  const cuda::Api* cuda = nullptr;

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (ready != nullptr) cuda->cudaEventDestroy(ready);
  }

  bool is_load() const noexcept { return direction == Direction::kLoad; }
};
static_assert(offsetof(Job, node) == 0);

/// One block of a job, as a worker takes it.
struct Task {
  Job* job = nullptr;
  std::size_t index = 0;

  const BlockOp& op() const noexcept { return job->blocks[index]; }
};

/// Whether `path` names an entry beneath `directory` (given without a trailing slash, or as
/// "/"), comparing strings as the read-after-write tracker does. Never allocates.
inline bool path_beneath(const std::string& path, std::string_view directory) noexcept {
  return !directory.empty() && path.size() > directory.size() &&
         path.compare(0, directory.size(), directory) == 0 &&
         (directory.back() == '/' || path[directory.size()] == '/');
}

/// Checks the blocks of a job before anything is allocated for it; returns whether any
/// segment is device memory. Throws std::invalid_argument for an empty path, null data or
/// segment address, data together with segments, device memory without `cuda_enabled`, or a
/// key longer than kMaxKeySize, a load block that names a file to recycle, or a file to
/// recycle whose name is not a tmp file name.
bool check_blocks(const std::vector<BlockOp>& blocks, Direction direction, bool cuda_enabled);

/// A fresh job over `blocks`, submitted now, with everything its scheduling will need
/// allocated (so that no worker allocates for it). Throws std::bad_alloc.
std::unique_ptr<Job> make_job(JobId id, Direction direction, std::vector<BlockOp> blocks);

}  // namespace kvtier::detail
