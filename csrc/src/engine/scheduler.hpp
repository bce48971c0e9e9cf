#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <atomic>
#include <string_view>
#include <unordered_set>

#include <kvtier/engine.hpp>

#include "engine/completions.hpp"
#include "engine/counters.hpp"
#include "engine/job.hpp"
#include "engine/pending_stores.hpp"
#include "io/block_io.hpp"

namespace kvtier::detail {

/// What a worker takes from the queues, fixed for its life: a thread cannot go back to a
/// higher priority once it ran at a lower one, so a load-first worker that runs at load_nice
/// never runs stores (see EngineConfig::load_nice).
enum class WorkerRole : std::uint8_t {
  kLoadOnly,    ///< loads only (n_read_threads when n_write_threads > 0), at load_nice
  kLoadFirst,   ///< loads first, stores when no load waits (n_write_threads == 0)
  kStoreFirst,  ///< stores first, loads when no store may run
};

/// The gauges of abandoned work (EngineStats::abandoned_ops, workers_stuck). Raised by the
/// watchdog before it wins a batch (so an abandoned worker that returns at once never takes
/// them below zero), lowered by the worker as it returns from the kernel. Lives with the
/// state abandoned workers share (engine.cpp's SharedIo), not with the scheduler.
class AbandonGauges {
 public:
  void abandon(std::size_t blocks) noexcept {
    ops_.fetch_add(blocks, std::memory_order_relaxed);
    workers_.fetch_add(1, std::memory_order_relaxed);
  }
  /// An abandoned worker returned from the kernel (or the watchdog lost the race). Release:
  /// whoever sees the gauge at 0 sees everything the worker did before.
  void returned(std::size_t blocks) noexcept {
    ops_.fetch_sub(blocks, std::memory_order_release);
    workers_.fetch_sub(1, std::memory_order_release);
  }
  std::uint64_t abandoned_ops() const noexcept { return ops_.load(std::memory_order_acquire); }
  std::uint64_t workers_stuck() const noexcept {
    return workers_.load(std::memory_order_acquire);
  }

 private:
  std::atomic<std::uint64_t> ops_{0}, workers_{0};
};

/// The scheduling choices an engine's configuration makes.
struct SchedulerOptions {
  /// Store operations at most in flight while loads wait or run (already adjusted: see
  /// Engine's constructor).
  unsigned store_cap_while_loading = 1;
  /// How long the store cap outlasts the last load.
  std::chrono::milliseconds store_cap_linger{100};
  /// Whether a worker takes up to kMaxBatchBlocks blocks of one job at once (the io_uring
  /// engine submits them together; psync gains nothing from it).
  bool batch_blocks = false;
  /// EngineConfig::io_timeout_s as a duration; zero: batches have no deadline.
  Clock::duration io_timeout{0};
  /// Where the watchdog counts what it abandons (required with io_timeout).
  AbandonGauges* gauges = nullptr;
};

/// Where a batch with a deadline stands. The worker and the watchdog race for the batch once
/// it is inside the kernel; one compare-and-swap decides, and whoever wins owns its outcome
/// (the loser never touches the caller's memory or the batch's jobs again).
enum class BatchState : int {
  kIdle,      ///< no deadline (io_timeout_s 0), or not running
  kCopying,   ///< copying the payload into the worker's own buffers: never timed out there
              ///< (memory speed, bounded), so the deadline waits for kInKernel
  kInKernel,  ///< the I/O runs on the worker's own buffers; the deadline applies
  kClaimed,   ///< the worker won: it copies loads out and records the batch as usual; a
              ///< load whose CRC failed in the copy out goes back to kInKernel to remove
              ///< its file, under a fresh deadline (Scheduler::reenter_kernel)
  kTimedOut,  ///< the watchdog won: the batch's blocks failed with ETIMEDOUT and were
              ///< reported; the worker is abandoned and exits when the kernel returns
};

/// A batch's place in drain()'s view between the moment its job left the list of incomplete
/// jobs and the moment its completion is poppable: the worker publishes without the mutex.
struct Publication {
  std::uint64_t seq = 0;     ///< the oldest job being published; 0: none
  std::uint64_t ticket = 0;  ///< the order publications began in
  Publication* prev = nullptr;
  Publication* next = nullptr;
};

/// A worker's batch: up to kMaxBatchBlocks blocks of one job, all loads or all stores. Owned
/// by its worker and reused from batch to batch; the scheduler fills it (next_batch) and
/// reads the results back (finish_batch).
struct Batch {
  Task tasks[kMaxBatchBlocks];
  const BlockOp* ops[kMaxBatchBlocks] = {};
  BlockResult results[kMaxBatchBlocks];
  std::size_t size = 0;
  bool is_load = false;
  Publication publication;

  /// The submitter's event the batch's device copies wait for (null: none).
  cuda::Event ready() const noexcept { return tasks[0].job->ready; }

  // With a deadline (SchedulerOptions::io_timeout): set by next_batch, read by the watchdog
  // with the scheduler's mutex held; `state` is the one field both sides write without it.
  std::atomic<BatchState> state{BatchState::kIdle};
  Clock::time_point deadline{};
  Batch* running_prev = nullptr;  // the scheduler's list of batches with a deadline
  Batch* running_next = nullptr;
  bool running_linked = false;
  void* owner = nullptr;  // the worker running it, handed to the watchdog's callback

  /// The worker: the I/O on its own buffers begins (the deadline set by next_batch applies
  /// from now on). Once claimed, the batch goes back in through Scheduler::reenter_kernel.
  void enter_kernel() noexcept { state.store(BatchState::kInKernel, std::memory_order_release); }
  /// The worker: the I/O returned. True when it won the batch; false when the watchdog timed
  /// it out first (the worker must then touch neither the jobs nor the caller's memory).
  bool claim() noexcept {
    BatchState expected = BatchState::kInKernel;
    return state.compare_exchange_strong(expected, BatchState::kClaimed,
                                         std::memory_order_acq_rel);
  }
};

/// What the watchdog abandoned: the worker (Batch::owner) and the blocks of its batch.
struct Abandoned {
  void* owner = nullptr;
  std::size_t blocks = 0;
};

/// The engine's queues and who runs what: loads first, the store cap, read-after-write
/// parking, drain(), cancellation at shutdown. Every member but the ids in flight and the
/// inbox is guarded by one mutex; workers hold it only to take a batch and to record one,
/// never during I/O, and publish completions after releasing it. Submitters never wait for
/// it (submit()).
///
/// Seams: a worker's life is next_batch() -> run_blocks() -> finish_batch(), so a caller
/// that must watch batches in flight (deadlines, replacing a stuck worker) sees each one
/// begin and end under the mutex, and the I/O itself knows nothing of the queues.
class Scheduler {
 public:
  Scheduler(SchedulerOptions options, Completions& completions)
      : options_(options), completions_(completions) {}
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- submitters (any thread) ---------------------------------------------------------------

  /// Queues a job whose blocks are checked and whose event (if any) is recorded. A job
  /// without blocks completes when it is queued (here, or by the intake thread). All or nothing: a
  /// submit that throws queued nothing and leaves the id free. Throws EngineShutDownError after
  /// stop(), std::invalid_argument for an id in flight, std::bad_alloc.
  ///
  /// Never waits for the thread holding the mutex (a worker preempted inside its few
  /// instructions of bookkeeping): when the mutex stays busy for kSubmitSpins tries, or jobs
  /// wait in the inbox already, the job goes into the inbox, a lock-free stack, and the
  /// intake thread (run_intake), or whoever takes the mutex first, queues it in submission
  /// order. Only with kInboxBound jobs there (a caller outrunning the intake thread) does a
  /// submit wait for the mutex, to queue them itself. Such a job cannot throw any more:
  /// if queueing it runs out of memory, every block fails with ENOMEM, and if stop() came
  /// first, with ECANCELED; it is reported either way.
  void submit(std::unique_ptr<Job> job);

  /// Blocks until every job submitted before the call has completed and its completion is
  /// poppable; jobs submitted meanwhile are not waited for.
  void drain();
  /// drain() for at most `limit`; false when it gave up before (nothing else changes then).
  bool drain_for(Clock::duration limit);

  /// Stops: submit() refuses from now on, every block not started fails with ECANCELED (its
  /// job is still reported), and next_batch() returns false once nothing is left to take.
  /// Idempotent.
  void stop() noexcept;
  bool stopped() const;

  /// Fails every block not started whose path lies beneath `directory` (path_beneath):
  /// queued loads and stores, loads parked behind a store or ready to run, each with
  /// ETIMEDOUT ("the root is degraded"); a job whose last block that was is reported at once.
  /// Blocks running are left to their deadline; other blocks of the same jobs run as usual.
  /// The engine keeps running. Returns how many blocks failed. Nothing here allocates.
  std::size_t fail_unstarted(std::string_view directory) noexcept;

  /// The queue and running counts, the counters and the jobs in flight.
  void stats(EngineStats& out) const;

  // ---- workers -------------------------------------------------------------------------------

  /// Waits for work `role` may take and fills `batch` with it; false once stop() was called
  /// and nothing is left for this worker (it then exits). Also ends `batch`'s previous
  /// publication.
  bool next_batch(WorkerRole role, Batch& batch);

  /// A worker that claimed `batch` goes back into the kernel with it (the syncs and renames
  /// of a store from memory, a corrupt file's removal): under a fresh deadline from now, as
  /// its first kernel phase was, not what is left of that one, which the claimed phase (a
  /// write into tmpfs, bounded by nothing but memory) may have used up.
  void reenter_kernel(Batch& batch) noexcept;

  /// Records the outcome of every block of `batch` (its results, set by run_blocks) and
  /// publishes the jobs it completed, after releasing the mutex. Never throws.
  void finish_batch(Batch& batch) noexcept;

  // ---- the consumer --------------------------------------------------------------------------

  /// Frees the ids of delivered jobs (linked by Job::undelivered_next) for reuse. Takes only
  /// the lock of the ids, never the one workers hold.
  void release_ids(const Job* delivered) noexcept;

  // ---- the intake thread ------------------------------------------------------------------

  /// The intake thread's body: queues the jobs submit() left in the inbox, until
  /// stop_intake(). Never throws.
  void run_intake() noexcept;
  /// Makes run_intake() return once the inbox is empty.
  void stop_intake() noexcept;

  // ---- the watchdog (SchedulerOptions::io_timeout > 0) -----------------------------------

  /// Waits until a batch's deadline passes, `poll` elapses or stop_watchdog() is called, then
  /// times out every batch inside the kernel past its deadline: its blocks fail with
  /// ETIMEDOUT, the jobs they completed are published at once, and each such batch is
  /// written to `out` (at most `capacity`; the rest wait for the next call). Returns how
  /// many; 0 also after stop_watchdog(). Never throws.
  std::size_t watch(Abandoned* out, std::size_t capacity, Clock::duration poll) noexcept;
  /// Makes watch() return at once, now and from now on.
  void stop_watchdog() noexcept;
  bool watchdog_stopped() const noexcept;

 private:
  bool lock_briefly(std::unique_lock<std::mutex>& lock) noexcept;
  bool push_inbox(Job* job) noexcept;

  // All of these run with mutex_ held.
  void take_inbox() noexcept;
  void admit(Job* job) noexcept;
  void refuse(Job* job, int error, const char* operation, const char* note) noexcept;
  void enqueue(Job& job);
  std::size_t loads_waiting() const noexcept { return queued_loads_ + ready_loads_.size; }
  bool store_allowed() const noexcept;
  bool stores_uncapped() const noexcept;
  void wake_for(Direction direction) noexcept;
  static void wake(std::condition_variable& cv, std::size_t idle, std::size_t blocks) noexcept;
  void wait_for_work(WorkerRole role, std::unique_lock<std::mutex>& lock);
  void park_blocked_loads() noexcept;
  static Task take_front(std::deque<Job*>& queue, std::size_t& queued) noexcept;
  bool take_load(Task& task) noexcept;
  bool take_store(Task& task) noexcept;
  bool pick(WorkerRole role, Task& task, bool& is_load) noexcept;
  std::size_t extend_batch(const Task& first, bool is_load, Task* more) noexcept;
  void after_batch(bool is_load, std::size_t blocks) noexcept;
  void release_store(const std::string& path) noexcept;
  Job* finish_block(const Task& task, BlockResult result) noexcept;
  Job* record_block(const Task& task, BlockResult result) noexcept;
  void cancel(const Task& task) noexcept;
  void fail_before_start(const Task& task) noexcept;
  std::size_t fail_queued(std::deque<Job*>& queue, std::size_t& queued,
                          std::string_view directory) noexcept;
  void link_incomplete(Job* job) noexcept;
  void complete_job(Job* job) noexcept;
  void link_running(Batch& batch) noexcept;
  void unlink_running(Batch& batch) noexcept;
  std::size_t expire(Clock::time_point now, Abandoned* out, std::size_t capacity) noexcept;
  void credit_pause(Clock::time_point now) noexcept;
  void end_publication(Publication& publication) noexcept;
  bool drained_through(std::uint64_t horizon) const noexcept;
  bool publishing_begun_by(std::uint64_t ticket) const noexcept;

  const SchedulerOptions options_;
  Completions& completions_;

  mutable std::mutex mutex_;
  // Load-only workers wait on load_available_, the others (which take stores) on
  // work_available_, so that a submit wakes only workers that may take its work; the idle
  // counts say how many wait on each, so a small job wakes as many workers as it has blocks.
  std::condition_variable work_available_, load_available_;
  std::size_t idle_workers_ = 0, idle_load_only_ = 0;
  // A queue holds whole jobs (one entry per job, so queueing a job is a single push_back that
  // either happens or throws); workers take a queued job's blocks in order (Job::next_block).
  std::deque<Job*> loads_, stores_;
  // Blocks not yet taken from the queues; loads whose stores finished (they run before
  // anything in loads_); the read-after-write tracker holding the parked ones.
  std::size_t queued_loads_ = 0, queued_stores_ = 0;
  ParkedList ready_loads_;
  PendingStores pending_;
  std::size_t running_loads_ = 0, running_stores_ = 0;
  // Until then the store cap holds although no load waits or runs (store_cap_linger after the
  // last load finished): an engine issuing one load at a time gets each next load in front of
  // a short device queue, not behind every worker's store.
  Clock::time_point loads_recent_until_{};
  // Submitted and not yet delivered. Guarded by ids_mutex_ alone, a leaf lock (taken inside
  // mutex_ by submit, alone by release_ids) that workers never take, so that freeing ids
  // never waits for a worker.
  std::mutex ids_mutex_;
  std::unordered_set<JobId> ids_in_flight_;
  // Written with mutex_ held, read by submit() without it.
  std::atomic<bool> stopping_{false};
  // Jobs submit() could not queue because the mutex was busy, newest first (a Treiber stack
  // through Job::inbox_next; only a holder of mutex_ takes them out), and the intake thread's
  // wake-up: a counter it waits on (std::atomic::wait, a futex), raised after every push.
  std::atomic<Job*> inbox_{nullptr};
  std::atomic<std::size_t> inbox_depth_{0};  // jobs in it, about (kInboxBound)
  std::atomic<std::uint32_t> intake_signal_{0};
  std::atomic<bool> intake_stopped_{false};
  // drain(): jobs not yet completed, oldest first; the seq of the latest submitted job; the
  // batches publishing completed jobs now.
  Job* oldest_ = nullptr;
  Job* newest_ = nullptr;
  std::uint64_t last_seq_ = 0;
  Publication* publishing_ = nullptr;
  std::uint64_t last_ticket_ = 0;
  std::size_t drain_waiters_ = 0;
  std::condition_variable drained_;

  // Batches with a deadline, oldest first (their deadlines are in start order, since every
  // batch gets the same io_timeout), and the watchdog waiting for the first to expire.
  Batch* running_oldest_ = nullptr;
  Batch* running_newest_ = nullptr;
  std::condition_variable watchdog_;
  bool watchdog_stopped_ = false;
  // When the watchdog meant to look next; later than a tick past it, it was paused.
  Clock::time_point watch_planned_ = Clock::now();

  Counters counters_;
  std::atomic<std::uint64_t> outstanding_{0};  // submitted jobs not yet completed (stats)
};

}  // namespace kvtier::detail
