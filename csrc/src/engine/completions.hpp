#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include <kvtier/job.hpp>

#include "engine/job.hpp"
#include "util/mpsc_queue.hpp"

namespace kvtier::detail {

/// Finished jobs on their way to Engine::pop_completions(), and the eventfd that says so.
///
/// Producers are the worker that finishes a job's last block, which publishes after releasing
/// the scheduler's mutex, and the rare paths that complete jobs with the mutex held (an empty
/// job at submit, cancellation at shutdown); any number of them publish at once. The queue is
/// lock-free (util/mpsc_queue.hpp): a publish never blocks and never fails, so a worker can
/// publish from any state. pop() callers take turns on a mutex of their own (the queue has a
/// single consumer), never the scheduler's. A push is two steps (claim the tail, link it);
/// while a producer is between them the consumer cannot reach what was pushed after its node
/// (it does once that producer links, instructions later), which is why drain() also waits
/// for the publications that began before it returns (Scheduler::drain).
class Completions {
 public:
  Completions() = default;
  /// Frees every job not yet delivered and closes the eventfd.
  ~Completions();
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  /// Creates the non-blocking eventfd signalled on every publish. Throws SystemError.
  void open_eventfd();
  /// The eventfd, or -1.
  int eventfd() const noexcept { return event_fd_; }
  /// Closes the eventfd (and nothing else: a forked child's copy, see Engine::~Engine).
  void close_eventfd() noexcept;

  /// Hands a finished job to the consumer; from here on the job is the consumer's and its
  /// publisher touches nothing of it. Any thread, with or without locks held: one atomic
  /// exchange and one store, then (with an eventfd) one non-blocking write. Never fails.
  void publish(Job* job) noexcept;

  /// Up to `max` (0: all available) published jobs as completions. `delivered` is called with
  /// the list of jobs about to be freed (linked by Job::undelivered_next) once their
  /// completions are made, still in this caller's turn. Throws std::bad_alloc when the result
  /// cannot be allocated; the jobs then stay, in order, for the next call.
  template <typename Delivered>
  std::vector<Completion> pop(std::size_t max, Delivered&& delivered) {
    std::lock_guard consumer(consumer_mutex_);
    Job* jobs = take(max);
    std::vector<Completion> out = convert(jobs);
    delivered(static_cast<const Job*>(jobs));
    free(jobs);
    return out;
  }

 private:
  // The rest of pop(), with consumer_mutex_ held.
  Job* take(std::size_t max) noexcept;
  std::vector<Completion> convert(Job* jobs);
  static void free(Job* jobs) noexcept;

  MpscQueue queue_;
  int event_fd_ = -1;
  // The queue's single consumer: pop() callers take turns here. Also guards `undelivered_`,
  // jobs a call whose conversion threw put back (delivered first by the next call).
  std::mutex consumer_mutex_;
  Job* undelivered_ = nullptr;
};

}  // namespace kvtier::detail
