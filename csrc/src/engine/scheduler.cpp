#include "engine/scheduler.hpp"

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <string>

#include <kvtier/error.hpp>

#include "io/block_file.hpp"

namespace kvtier::detail {

// ---- submitters ----------------------------------------------------------------------------

namespace {

// How many times submit() tries the mutex before it leaves its job in the inbox: a holder
// that runs is out within this (its bookkeeping is a few hundred instructions); one that was
// preempted is not waited for.
constexpr int kSubmitSpins = 64;

// Jobs the inbox holds at most before a submit waits for the mutex after all: only a caller
// that outruns the intake thread by this much (it submits in a tight loop on many threads,
// so the intake thread gets no CPU) is slowed down, to the pace the queues are filled at,
// instead of growing the inbox without bound.
constexpr std::size_t kInboxBound = 1024;

constexpr const char* kCancelledNote = "engine shut down before the block operation started";

// How often the watchdog looks while a batch has a deadline (a quarter of io_timeout, at
// most 250 ms), and the time a batch has at least once a pause is over (its whole timeout,
// at most a second): a pause costs a batch at most a tick of its timeout.
Clock::duration watch_tick(Clock::duration io_timeout) noexcept {
  return std::min<Clock::duration>(io_timeout / 4, std::chrono::milliseconds(250));
}
Clock::duration pause_grace(Clock::duration io_timeout) noexcept {
  return std::min<Clock::duration>(io_timeout, std::chrono::seconds(1));
}

inline void spin_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void Scheduler::submit(std::unique_ptr<Job> owned) {
  Job* job = owned.get();
  if (stopping_.load()) throw EngineShutDownError("kvtier engine is shut down; submit refused");
  {
    std::lock_guard ids(ids_mutex_);
    if (!ids_in_flight_.insert(job->id).second)
      throw std::invalid_argument("job id " + std::to_string(job->id) +
                                  " is already in flight (ids are reusable once popped)");
  }
  const auto free_id = [&] {
    std::lock_guard ids(ids_mutex_);
    ids_in_flight_.erase(job->id);
  };
  std::unique_lock lock(mutex_, std::defer_lock);
  // Behind jobs already in the inbox a submit goes there too without trying the mutex: it
  // keeps their order cheaply, and leaves the mutex to the intake thread that empties it.
  const bool inbox_empty = inbox_.load(std::memory_order_relaxed) == nullptr;
  if ((inbox_empty && lock_briefly(lock)) ||
      (inbox_depth_.load(std::memory_order_relaxed) >= kInboxBound && (lock.lock(), true))) {
    // All or nothing: each step that can throw (bad_alloc) is undone before the exception
    // leaves, and the job becomes visible to workers and drain() only once nothing can fail.
    take_inbox();  // jobs submitted earlier go first (read-after-write follows that order)
    if (stopping_.load(std::memory_order_relaxed)) {
      free_id();
      throw EngineShutDownError("kvtier engine is shut down; submit refused");
    }
    try {
      enqueue(*job);
    } catch (...) {
      free_id();
      throw;
    }
    owned.release();
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    admit(job);
    return;
  }
  // The mutex is busy: nothing from here on can fail or wait.
  owned.release();
  outstanding_.fetch_add(1, std::memory_order_relaxed);
  counters_.record_intake_submit();
  const bool first = push_inbox(job);
  // stop() takes the inbox after it sets stopping_ (both sequentially consistent): either
  // it saw this job, or this load sees it stopping and the job is cancelled here, never left
  // in an inbox nobody takes. Only a submit racing shutdown waits for the mutex.
  if (stopping_.load()) {
    std::lock_guard stopped(mutex_);
    take_inbox();
    return;
  }
  // Onto a non-empty inbox: whoever made it non-empty wakes the intake thread, which takes
  // the whole stack at once, this job included.
  if (!first) return;
  intake_signal_.fetch_add(1, std::memory_order_release);
  intake_signal_.notify_one();
}

bool Scheduler::lock_briefly(std::unique_lock<std::mutex>& lock) noexcept {
  for (int i = 0; i < kSubmitSpins; ++i) {
    if (lock.try_lock()) return true;
    spin_pause();
  }
  return false;
}

// Returns whether the inbox was empty before.
bool Scheduler::push_inbox(Job* job) noexcept {
  inbox_depth_.fetch_add(1, std::memory_order_relaxed);
  Job* head = inbox_.load(std::memory_order_relaxed);
  do {
    job->inbox_next = head;
  } while (!inbox_.compare_exchange_weak(head, job, std::memory_order_seq_cst,
                                         std::memory_order_relaxed));
  return head == nullptr;
}

// Queues every job in the inbox, oldest first (mutex held). Called by everything that reads
// or changes the queues on a caller's behalf, so that a job whose submit returned is never
// behind one submitted after it, and drain(), stats() and fail_unstarted() see it.
void Scheduler::take_inbox() noexcept {
  // Sequentially consistent, like the push and stop()'s store before it (see submit).
  if (inbox_.load() == nullptr) return;
  Job* newest = inbox_.exchange(nullptr);
  Job* oldest = nullptr;
  std::size_t taken = 0;
  while (newest != nullptr) {  // the stack holds the newest first
    Job* next = newest->inbox_next;
    newest->inbox_next = oldest;
    oldest = newest;
    newest = next;
    ++taken;
  }
  inbox_depth_.fetch_sub(taken, std::memory_order_relaxed);
  while (oldest != nullptr) {
    Job* job = oldest;
    oldest = job->inbox_next;
    job->inbox_next = nullptr;
    if (stopping_.load(std::memory_order_relaxed)) {
      refuse(job, ECANCELED, "cancel", kCancelledNote);
      continue;
    }
    try {
      enqueue(*job);
    } catch (const std::bad_alloc&) {
      refuse(job, ENOMEM, job->is_load() ? "load" : "store",
             "out of memory while queueing the job (it was submitted while the engine's "
             "scheduler was busy)");
      continue;
    }
    admit(job);
  }
}

// A job in its queue (or without blocks) becomes visible to drain() and the workers (mutex
// held).
void Scheduler::admit(Job* job) noexcept {
  const std::size_t n = job->blocks.size();
  link_incomplete(job);
  if (n == 0) {
    complete_job(job);
    // Published with the mutex held, so drain() never sees it gone before it is poppable.
    completions_.publish(job);
    return;
  }
  (job->is_load() ? queued_loads_ : queued_stores_) += n;
  wake_for(job->direction);
}

// A job from the inbox that cannot be queued: every block fails with `error` and the job is
// published (mutex held). It never reached the read-after-write tracker, so nothing is
// released there.
void Scheduler::refuse(Job* job, int error, const char* operation, const char* note) noexcept {
  link_incomplete(job);
  if (job->blocks.empty()) {
    complete_job(job);
    completions_.publish(job);
    return;
  }
  Job* done = nullptr;
  for (std::size_t i = 0; i < job->blocks.size(); ++i)
    done = record_block({job, i}, unallocated_failure(error, operation, note));
  completions_.publish(done);
}

void Scheduler::run_intake() noexcept {
  for (;;) {
    const std::uint32_t seen = intake_signal_.load(std::memory_order_acquire);
    if (inbox_.load(std::memory_order_acquire) != nullptr) {
      std::lock_guard lock(mutex_);
      take_inbox();
      continue;
    }
    if (intake_stopped_.load(std::memory_order_acquire)) return;
    intake_signal_.wait(seen, std::memory_order_acquire);
  }
}

void Scheduler::stop_intake() noexcept {
  intake_stopped_.store(true, std::memory_order_release);
  intake_signal_.fetch_add(1, std::memory_order_release);
  intake_signal_.notify_all();
}

// Puts a job with blocks into its queue, its stores into the read-after-write tracker first.
void Scheduler::enqueue(Job& job) {
  if (job.blocks.empty()) return;
  if (job.is_load()) {
    loads_.push_back(&job);
    return;
  }
  pending_.add(job);
  try {
    stores_.push_back(&job);
  } catch (...) {
    for (const BlockOp& op : job.blocks) release_store(op.path);
    throw;
  }
}

void Scheduler::drain() {
  drain_for(Clock::duration::max());
}

bool Scheduler::drain_for(Clock::duration limit) {
  const bool forever = limit == Clock::duration::max();
  const Clock::time_point until = forever ? Clock::time_point::max() : Clock::now() + limit;
  const auto wait = [&](std::unique_lock<std::mutex>& lock, auto done) {
    if (forever) {
      drained_.wait(lock, done);
      return true;
    }
    return drained_.wait_until(lock, until, done);
  };
  std::unique_lock lock(mutex_);
  take_inbox();  // jobs whose submit returned before this call get their seq now
  // Jobs submitted later (by other threads) get a larger seq and are not waited for, so a
  // steady stream of new work cannot hold drain() forever.
  const std::uint64_t horizon = last_seq_;
  ++drain_waiters_;
  bool drained = wait(lock, [&] { return drained_through(horizon); });
  // Every job up to the horizon is in the completion queue now, but a publication that began
  // earlier may still be between its two steps (MpscQueue::push), and until it links its
  // node the consumer cannot reach the nodes pushed after it. Those are few and end within
  // instructions; publications that begin from now on are not waited for.
  if (drained) {
    const std::uint64_t begun = last_ticket_;
    drained = wait(lock, [&] { return !publishing_begun_by(begun); });
  }
  --drain_waiters_;
  return drained;
}

// Whether a publication that began at or before `ticket` is still under way.
bool Scheduler::publishing_begun_by(std::uint64_t ticket) const noexcept {
  for (const Publication* p = publishing_; p != nullptr; p = p->next)
    if (p->ticket <= ticket) return true;
  return false;
}

// Whether every job up to `horizon` has completed and been published.
bool Scheduler::drained_through(std::uint64_t horizon) const noexcept {
  if (oldest_ != nullptr && oldest_->seq <= horizon) return false;
  for (const Publication* p = publishing_; p != nullptr; p = p->next)
    if (p->seq <= horizon) return false;
  return true;
}

void Scheduler::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
    take_inbox();  // cancels them (stopping_ is set first: see submit)
    // Every block not started fails: queued loads (ready, parked, in the queue) and stores.
    // The parked loads are moved out first, so cancelling a store (which releases its path)
    // and stores still running wake nobody. Nothing here allocates.
    pending_.unpark_all(ready_loads_);
    Task task;
    while (take_load(task)) cancel(task);
    while (!stores_.empty()) cancel(take_front(stores_, queued_stores_));
  }
  work_available_.notify_all();
  load_available_.notify_all();
}

std::size_t Scheduler::fail_unstarted(std::string_view directory) noexcept {
  std::lock_guard lock(mutex_);
  take_inbox();
  const auto beneath = [directory](const ParkedLoad& p) {
    return path_beneath(p.job->blocks[p.index].path, directory);
  };
  // Parked and ready loads are moved out first, as in stop(): failing a store of their path
  // (which releases it) then makes none of them ready. A parked load's path is its store's,
  // so the loads a released path makes ready are never beneath `directory`.
  ParkedList doomed;
  pending_.unpark_beneath(directory, doomed);
  ready_loads_.extract_if(beneath, doomed);
  std::size_t failed = doomed.size;
  while (ParkedLoad* p = doomed.pop()) fail_before_start({p->job, p->index});
  failed += fail_queued(loads_, queued_loads_, directory);
  failed += fail_queued(stores_, queued_stores_, directory);
  return failed;
}

// The blocks beneath `directory` of the jobs in `queue` (mutex held). A job's queue entry and
// cursor are settled before any of its blocks is failed: failing its last one publishes it,
// and from then on the job is the consumer's.
std::size_t Scheduler::fail_queued(std::deque<Job*>& queue, std::size_t& queued,
                                   std::string_view directory) noexcept {
  // Not started and not failed yet: the blocks this call fails.
  const auto doomed = [directory](const Job& job, std::size_t i) {
    return job.block_errnos[i] == 0 && path_beneath(job.blocks[i].path, directory);
  };
  std::size_t failed = 0;
  for (auto it = queue.begin(); it != queue.end();) {
    Job* job = *it;
    const std::size_t first = job->next_block, n = job->blocks.size();
    std::size_t count = 0;
    for (std::size_t i = first; i < n; ++i) count += doomed(*job, i) ? 1 : 0;
    if (count == 0) {
      ++it;
      continue;
    }
    while (job->next_block < n && (job->block_errnos[job->next_block] != 0 ||
                                   doomed(*job, job->next_block)))
      ++job->next_block;
    it = job->next_block == n ? queue.erase(it) : it + 1;  // erasing pointers never throws
    queued -= count;
    failed += count;
    // Only the last of them can complete (and publish) the job: the loop ends with it.
    for (std::size_t i = first; count > 0; ++i)
      if (doomed(*job, i)) {
        --count;
        fail_before_start({job, i});
      }
  }
  return failed;
}

bool Scheduler::stopped() const {
  return stopping_.load();
}

void Scheduler::stats(EngineStats& out) const {
  counters_.snapshot(out);
  out.jobs_in_flight = outstanding_.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  out.queued_loads = loads_waiting() + pending_.parked();
  out.queued_stores = queued_stores_;
  // The inbox's jobs count as queued. Walking it is safe here: only a holder of the mutex
  // takes jobs out, and pushes only put new ones in front.
  for (const Job* job = inbox_.load(std::memory_order_acquire); job != nullptr;
       job = job->inbox_next)
    (job->is_load() ? out.queued_loads : out.queued_stores) += job->blocks.size();
  out.running_loads = running_loads_;
  out.running_stores = running_stores_;
}

// Only ids_mutex_: the consumer never waits for a worker that holds mutex_ (section 18 of
// docs/PERFORMANCE.md: a store worker preempted while holding it made pop_completions wait
// for milliseconds).
void Scheduler::release_ids(const Job* delivered) noexcept {
  std::lock_guard ids(ids_mutex_);
  for (const Job* job = delivered; job != nullptr; job = job->undelivered_next)
    ids_in_flight_.erase(job->id);
}

// ---- workers -------------------------------------------------------------------------------

bool Scheduler::next_batch(WorkerRole role, Batch& batch) {
  std::unique_lock lock(mutex_);
  end_publication(batch.publication);
  take_inbox();
  Task task;
  bool is_load = false;
  while (!pick(role, task, is_load)) {
    if (stopping_) return false;
    wait_for_work(role, lock);
  }
  batch.tasks[0] = task;
  batch.size = 1 + extend_batch(task, is_load, batch.tasks + 1);
  batch.is_load = is_load;
  (is_load ? running_loads_ : running_stores_) += batch.size;
  for (std::size_t i = 0; i < batch.size; ++i) {
    batch.ops[i] = &batch.tasks[i].op();
    batch.results[i] = BlockResult{};
  }
  if (options_.io_timeout.count() > 0) {
    batch.deadline = Clock::now() + options_.io_timeout;
    batch.state.store(BatchState::kCopying, std::memory_order_relaxed);
    link_running(batch);
  }
  return true;
}

void Scheduler::reenter_kernel(Batch& batch) noexcept {
  std::lock_guard lock(mutex_);
  // To the list's end: no deadline in it is later than now + io_timeout (credit_pause's
  // floor is at most that), so it stays in deadline order.
  unlink_running(batch);
  batch.deadline = Clock::now() + options_.io_timeout;
  link_running(batch);
  batch.state.store(BatchState::kInKernel, std::memory_order_release);
}

// Newest last: every batch gets the same timeout, so the list is in deadline order and the
// watchdog only ever looks at its front.
void Scheduler::link_running(Batch& batch) noexcept {
  batch.running_prev = running_newest_;
  batch.running_next = nullptr;
  (running_newest_ != nullptr ? running_newest_->running_next : running_oldest_) = &batch;
  running_newest_ = &batch;
  batch.running_linked = true;
  if (batch.running_prev == nullptr) watchdog_.notify_one();  // it waited for no deadline
}

void Scheduler::unlink_running(Batch& batch) noexcept {
  if (!batch.running_linked) return;
  (batch.running_prev != nullptr ? batch.running_prev->running_next : running_oldest_) =
      batch.running_next;
  (batch.running_next != nullptr ? batch.running_next->running_prev : running_newest_) =
      batch.running_prev;
  batch.running_prev = batch.running_next = nullptr;
  batch.running_linked = false;
}

std::size_t Scheduler::watch(Abandoned* out, std::size_t capacity, Clock::duration poll) noexcept {
  std::unique_lock lock(mutex_);
  const Clock::time_point give_up = Clock::now() + poll;
  const Clock::duration tick = watch_tick(options_.io_timeout);
  std::size_t n = 0;
  while (!watchdog_stopped_) {
    const Clock::time_point now = Clock::now();
    if (now - watch_planned_ > tick) credit_pause(now);
    n = expire(now, out, capacity);
    if (n > 0 || now >= give_up) break;
    // Until the front batch's deadline; shortly when it is still copying past it (it is
    // timed out as soon as it enters the kernel). At least every tick while a batch runs:
    // a wake-up that comes a tick late is how a pause shows (credit_pause).
    Clock::time_point until = give_up;
    if (running_oldest_ != nullptr)
      until = std::min({until, now + tick,
                        running_oldest_->deadline > now ? running_oldest_->deadline
                                                        : now + std::chrono::milliseconds(5)});
    watch_planned_ = until;
    watchdog_.wait_until(lock, until);
  }
  // The caller is back at once (its work between two calls is short): a return that comes
  // later than that is a pause too.
  watch_planned_ = Clock::now();
  return n;
}

// The watchdog woke more than a tick after it planned: this process was stopped (SIGSTOP, a
// cgroup freezer, `docker pause`, a VM paused) or the watchdog got no CPU. Time the watchdog
// could not watch does not count against a deadline: every batch gets the time since the
// planned wake-up back (since its start, if it started after that), and at least a grace
// to return in, for its worker has not run since the pause either. The list stays in
// deadline order: the batches that started before the planned wake-up all move by the same
// amount, and every later one ends at now + io_timeout, after all of them.
void Scheduler::credit_pause(Clock::time_point now) noexcept {
  if (running_oldest_ == nullptr) return;  // nothing was under a deadline
  const Clock::time_point floor = now + pause_grace(options_.io_timeout);
  for (Batch* batch = running_oldest_; batch != nullptr; batch = batch->running_next) {
    const Clock::time_point start = batch->deadline - options_.io_timeout;
    batch->deadline = std::max(batch->deadline + (now - std::max(watch_planned_, start)), floor);
  }
  counters_.record_watchdog_pause();
}

// Times out the batches past their deadline that are inside the kernel (mutex held). The
// batch's memory is the worker's: read everything needed before the compare-and-swap, for
// once the watchdog has won, the worker may return from the kernel and free it at any time.
std::size_t Scheduler::expire(Clock::time_point now, Abandoned* out,
                              std::size_t capacity) noexcept {
  std::size_t n = 0;
  Batch* batch = running_oldest_;
  while (batch != nullptr && batch->deadline <= now && n < capacity) {
    Batch* next = batch->running_next;
    if (batch->state.load(std::memory_order_acquire) != BatchState::kInKernel) {
      batch = next;  // copying (bounded), or claimed and on its way to finish_batch
      continue;
    }
    Task tasks[kMaxBatchBlocks];
    const std::size_t size = batch->size;
    const bool is_load = batch->is_load;
    void* owner = batch->owner;
    for (std::size_t i = 0; i < size; ++i) tasks[i] = batch->tasks[i];
    unlink_running(*batch);
    options_.gauges->abandon(size);
    BatchState expected = BatchState::kInKernel;
    if (!batch->state.compare_exchange_strong(expected, BatchState::kTimedOut,
                                              std::memory_order_acq_rel)) {
      options_.gauges->returned(size);
      link_running(*batch);  // the worker claimed it first; its finish_batch unlinks it
      batch = next;
      continue;
    }
    // From here on `batch` is never touched again.
    after_batch(is_load, size);
    counters_.record_timeouts(size);
    for (std::size_t i = 0; i < size; ++i) {
      BlockResult r = unallocated_failure(ETIMEDOUT, is_load ? "load" : "store",
                              "block operation did not finish within io_timeout_s; abandoned "
                              "in the kernel (the storage stopped answering)");
      // Published with the mutex held, like a job without blocks: drain() never sees it gone
      // before it is poppable.
      if (Job* job = finish_block(tasks[i], std::move(r))) completions_.publish(job);
    }
    out[n++] = Abandoned{owner, size};
    batch = next;
  }
  return n;
}

void Scheduler::stop_watchdog() noexcept {
  {
    std::lock_guard lock(mutex_);
    watchdog_stopped_ = true;
  }
  watchdog_.notify_all();
}

bool Scheduler::watchdog_stopped() const noexcept {
  std::lock_guard lock(mutex_);
  return watchdog_stopped_;
}

void Scheduler::finish_batch(Batch& batch) noexcept {
  Job* completed[kMaxBatchBlocks];
  std::size_t n_completed = 0;
  {
    std::lock_guard lock(mutex_);
    unlink_running(batch);
    batch.state.store(BatchState::kIdle, std::memory_order_relaxed);
    after_batch(batch.is_load, batch.size);
    for (std::size_t i = 0; i < batch.size; ++i)
      if (Job* job = finish_block(batch.tasks[i], std::move(batch.results[i])))
        completed[n_completed++] = job;
    if (n_completed == 0) return;
    // drain() must not see these jobs gone before they are poppable: until this worker's
    // next call of next_batch(), the batch stands in for them.
    Publication& p = batch.publication;
    p.seq = completed[0]->seq;
    for (std::size_t i = 1; i < n_completed; ++i) p.seq = std::min(p.seq, completed[i]->seq);
    p.ticket = ++last_ticket_;
    p.prev = nullptr;
    p.next = publishing_;
    if (publishing_ != nullptr) publishing_->prev = &p;
    publishing_ = &p;
  }
  for (std::size_t i = 0; i < n_completed; ++i) completions_.publish(completed[i]);
}

void Scheduler::end_publication(Publication& p) noexcept {
  if (p.seq == 0) return;
  (p.prev != nullptr ? p.prev->next : publishing_) = p.next;
  if (p.next != nullptr) p.next->prev = p.prev;
  p = Publication{};
  if (drain_waiters_ > 0) drained_.notify_all();
}

void Scheduler::wait_for_work(WorkerRole role, std::unique_lock<std::mutex>& lock) {
  const bool load_only = role == WorkerRole::kLoadOnly;
  std::size_t& idle = load_only ? idle_load_only_ : idle_workers_;
  ++idle;
  if (load_only) {
    load_available_.wait(lock);
  } else if (!stores_.empty() && loads_recent_until_ > Clock::now()) {
    // Capped by the linger alone: nobody else sees it end, so whoever wakes at its end lifts
    // the cap for every waiting worker.
    if (work_available_.wait_until(lock, loads_recent_until_) == std::cv_status::timeout &&
        Clock::now() >= loads_recent_until_)
      work_available_.notify_all();
  } else {
    work_available_.wait(lock);
  }
  --idle;
}

// A batch's blocks stopped running: the store cap and who is woken follow.
void Scheduler::after_batch(bool is_load, std::size_t blocks) noexcept {
  (is_load ? running_loads_ : running_stores_) -= blocks;
  const bool linger = options_.store_cap_linger.count() > 0;
  if (is_load && linger) loads_recent_until_ = Clock::now() + options_.store_cap_linger;
  // The last load ends the cap, or starts its linger: then one waiting worker is woken to
  // wait for the linger's end (and to run a store if the cap was 0). A finished store frees
  // one slot, which this worker takes itself unless a load comes first.
  if (is_load && loads_waiting() == 0 && running_loads_ == 0 && !stores_.empty())
    wake(work_available_, idle_workers_, linger ? 1 : queued_stores_);
  else if (!is_load && !stores_.empty())
    work_available_.notify_one();
}

// ---- picking work --------------------------------------------------------------------------

// A store may start unless loads are waiting or running (or finished recently) and the cap is
// reached; this keeps the device queue short so a load waits for at most the stores already
// issued. Parked loads do not count: they wait for stores, which must be free to run. After
// the last load the cap is at least 1, so stores never stall while none waits.
bool Scheduler::store_allowed() const noexcept {
  if (loads_waiting() > 0 || running_loads_ > 0)
    return running_stores_ < options_.store_cap_while_loading;
  if (running_stores_ == 0 || loads_recent_until_ == Clock::time_point{}) return true;
  return running_stores_ < std::max(1u, options_.store_cap_while_loading) ||
         Clock::now() >= loads_recent_until_;
}

// Whether no store cap is in effect: no load waits or runs and none finished within the
// linger. Only then may a store batch grow past one block (extend_batch).
bool Scheduler::stores_uncapped() const noexcept {
  return loads_waiting() == 0 && running_loads_ == 0 &&
         (loads_recent_until_ == Clock::time_point{} || Clock::now() >= loads_recent_until_);
}

// Wakes enough idle workers for the queued blocks of one direction. The idle counts include
// workers notified but not yet running, so every block queued (not only the newest job's) is
// counted: a notify_one only reaches a still-blocked worker, and so at least
// min(queued, idle) workers are on their way.
void Scheduler::wake_for(Direction direction) noexcept {
  if (direction == Direction::kStore) {
    wake(work_available_, idle_workers_, queued_stores_);
    return;
  }
  std::size_t blocks = loads_waiting();
  if (idle_load_only_ > 0) {
    wake(load_available_, idle_load_only_, blocks);
    if (blocks <= idle_load_only_) return;
    blocks -= idle_load_only_;
  }
  wake(work_available_, idle_workers_, blocks);
}

void Scheduler::wake(std::condition_variable& cv, std::size_t idle, std::size_t blocks) noexcept {
  if (blocks >= idle) {
    cv.notify_all();
    return;
  }
  for (std::size_t i = 0; i < blocks; ++i) cv.notify_one();
}

// Parks the loads at the front of the load queue whose path has a pending store, so that the
// front (if any) is a load that may run now. Called before every pick: afterwards
// store_allowed() no longer counts loads that are really waiting for stores.
void Scheduler::park_blocked_loads() noexcept {
  if (pending_.empty()) return;
  while (!loads_.empty()) {
    Job* job = loads_.front();
    ParkedLoad* link = &job->parking[job->next_block];
    link->job = job;
    link->index = job->next_block;
    if (!pending_.park(job->blocks[job->next_block].path, link)) return;
    take_front(loads_, queued_loads_);
  }
}

// The next block of the job at the front of `queue`; drops the job once all are taken.
Task Scheduler::take_front(std::deque<Job*>& queue, std::size_t& queued) noexcept {
  Job* job = queue.front();
  Task task{job, job->next_block++};
  // Blocks failed before they started (fail_unstarted) were reported already: skipped.
  while (job->next_block < job->blocks.size() && job->block_errnos[job->next_block] != 0)
    ++job->next_block;
  if (job->next_block == job->blocks.size()) queue.pop_front();
  --queued;
  return task;
}

bool Scheduler::take_load(Task& task) noexcept {
  if (ParkedLoad* p = ready_loads_.pop()) {  // older than anything in loads_
    task = {p->job, p->index};
    return true;
  }
  if (loads_.empty()) return false;
  task = take_front(loads_, queued_loads_);
  return true;
}

bool Scheduler::take_store(Task& task) noexcept {
  if (stores_.empty() || !store_allowed()) return false;
  task = take_front(stores_, queued_stores_);
  return true;
}

bool Scheduler::pick(WorkerRole role, Task& task, bool& is_load) noexcept {
  park_blocked_loads();
  const bool load_first = role != WorkerRole::kStoreFirst;
  if (load_first ? take_load(task) : take_store(task)) {
    is_load = load_first;
    return true;
  }
  if (load_first ? role == WorkerRole::kLoadFirst && take_store(task) : take_load(task)) {
    is_load = !load_first;
    return true;
  }
  return false;
}

// More blocks of `first`'s job for the same io_uring submission, taken while the job is still
// at the front of its queue: up to kMaxBatchBlocks blocks and kBatchBytes of payload (a 2 MiB
// block goes alone, 256 KiB blocks go eight at a time). Stores join a batch only while no
// store cap is in effect (no load waiting, running or within the linger), so a load that
// arrives meanwhile waits for at most one batch's device time, the same order as one large
// block's. Loads never join past a pending store of their path (read-after-write). psync
// gains nothing from batching: one block at a time.
std::size_t Scheduler::extend_batch(const Task& first, bool is_load, Task* more) noexcept {
  if (!options_.batch_blocks) return 0;
  constexpr std::uint64_t kBatchBytes = std::uint64_t{2} << 20;
  std::deque<Job*>& queue = is_load ? loads_ : stores_;
  std::size_t& queued = is_load ? queued_loads_ : queued_stores_;
  std::uint64_t bytes = first.op().payload_length();
  std::size_t n = 0;
  while (n + 1 < kMaxBatchBlocks && !queue.empty() && queue.front() == first.job) {
    const BlockOp& op = first.job->blocks[first.job->next_block];
    if (bytes + op.payload_length() > kBatchBytes) break;
    if (is_load ? pending_.pending(op.path) : !stores_uncapped()) break;
    bytes += op.payload_length();
    more[n++] = take_front(queue, queued);
  }
  return n;
}

// ---- outcomes ------------------------------------------------------------------------------

// One store block of `path` finished, was cancelled or rolled back: loads parked on the path
// become ready when it was the last.
void Scheduler::release_store(const std::string& path) noexcept {
  if (pending_.release(path, ready_loads_) > 0) wake_for(Direction::kLoad);
}

// Records a block's outcome; returns its job when that was the job's last block (the job is
// then complete and must be published by the caller).
Job* Scheduler::finish_block(const Task& task, BlockResult result) noexcept {
  if (!task.job->is_load()) release_store(task.op().path);
  return record_block(task, std::move(result));
}

// finish_block() without the read-after-write tracker: for a job that never reached it.
Job* Scheduler::record_block(const Task& task, BlockResult result) noexcept {
  Job* job = task.job;
  const bool load = job->is_load();
  job->block_errnos[task.index] = result.error;
  counters_.record_block(load, result);
  if (result.ok()) {
    job->bytes += result.bytes;
  } else if (!job->failed) {
    job->failed = true;
    // Moves and pointer copies only: nothing here allocates (see Job::FirstFailure).
    job->error.errno_value = result.error;
    job->error.operation = result.operation;
    job->error.path = std::move(result.path);
    job->error.message = std::move(result.message);
    job->error.note = result.note;
    job->error.block = task.index;
  }
  if (--job->remaining > 0) return nullptr;
  complete_job(job);
  return job;
}

// A block that never started, at shutdown; its job is published at once (mutex held).
void Scheduler::cancel(const Task& task) noexcept {
  // No copy of the path or message: the report takes them from the job when it is popped.
  if (Job* job = finish_block(task, unallocated_failure(ECANCELED, "cancel", kCancelledNote)))
    completions_.publish(job);
}

// A block that never started, beneath a root the caller found degraded (fail_unstarted); its
// job is published at once when this was its last block (mutex held).
void Scheduler::fail_before_start(const Task& task) noexcept {
  BlockResult r = unallocated_failure(ETIMEDOUT, task.job->is_load() ? "load" : "store",
                          "root is degraded (its storage stopped answering); the block "
                          "operation failed before it started");
  if (Job* job = finish_block(task, std::move(r))) completions_.publish(job);
}

// Adds a submitted job to the list of incomplete jobs (newest last).
void Scheduler::link_incomplete(Job* job) noexcept {
  job->seq = ++last_seq_;
  job->older = newest_;
  (newest_ != nullptr ? newest_->newer : oldest_) = job;
  newest_ = job;
}

// A job's last block finished: it leaves the list of incomplete jobs. Its caller publishes it.
void Scheduler::complete_job(Job* job) noexcept {
  job->seconds = std::chrono::duration<double>(Clock::now() - job->submitted).count();
  counters_.record_job(job->is_load(), job->failed);
  (job->older != nullptr ? job->older->newer : oldest_) = job->newer;
  (job->newer != nullptr ? job->newer->older : newest_) = job->older;
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
  // Only the oldest job's completion can move drain()'s horizon.
  if (job->older == nullptr && drain_waiters_ > 0) drained_.notify_all();
}

}  // namespace kvtier::detail
