#include "engine/completions.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include <kvtier/error.hpp>

namespace kvtier::detail {
namespace {

Completion completion_of(const Job& job) {
  Completion c;
  c.job_id = job.id;
  c.direction = job.direction;
  c.success = !job.failed;
  c.block_errnos = job.block_errnos;
  const Job::FirstFailure& f = job.error;
  c.error.errno_value = f.errno_value;
  c.error.operation = f.operation;
  if (f.errno_value != 0) {
    c.error.path = f.path.empty() && f.block < job.blocks.size() ? job.blocks[f.block].path : f.path;
    c.error.message = f.message.empty() && f.note != nullptr ? std::string(f.note) : f.message;
  }
  c.bytes = job.bytes;
  c.seconds = job.seconds;
  return c;
}

}  // namespace

Completions::~Completions() {
  free(undelivered_);
  while (MpscNode* node = queue_.try_pop()) delete reinterpret_cast<Job*>(node);
  if (event_fd_ >= 0) ::close(event_fd_);
}

void Completions::open_eventfd() {
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) {
    const int e = errno;  // read before the error's strings are made
    throw KVTIER_SYSTEM_ERROR(e, "eventfd failed", "");
  }
}

void Completions::close_eventfd() noexcept {
  if (event_fd_ >= 0) ::close(event_fd_);
  event_fd_ = -1;
}

void Completions::publish(Job* job) noexcept {
  queue_.push(&job->node);
  if (event_fd_ >= 0) {
    const std::uint64_t one = 1;
    // Non-blocking; EAGAIN only when the counter is saturated, which still reads as "ready".
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
  }
}

// Unlinks up to `max` jobs, those put back by an earlier call first; allocates nothing.
Job* Completions::take(std::size_t max) noexcept {
  Job* head = nullptr;
  Job** link = &head;
  for (std::size_t count = 0; max == 0 || count < max; ++count) {
    Job* job = undelivered_;
    if (job != nullptr) {
      undelivered_ = job->undelivered_next;
    } else {
      MpscNode* node = queue_.try_pop();
      if (node == nullptr) break;
      job = reinterpret_cast<Job*>(node);
    }
    job->undelivered_next = nullptr;
    *link = job;
    link = &job->undelivered_next;
  }
  return head;
}

// The jobs' completions. When that throws, the jobs go back in front of the queue for the
// next call, so no completion is ever lost.
std::vector<Completion> Completions::convert(Job* jobs) {
  std::vector<Completion> out;
  try {
    std::size_t count = 0;
    for (const Job* job = jobs; job != nullptr; job = job->undelivered_next) ++count;
    out.reserve(count);
    for (const Job* job = jobs; job != nullptr; job = job->undelivered_next)
      out.push_back(completion_of(*job));
  } catch (...) {
    if (jobs != nullptr) {
      Job* last = jobs;
      while (last->undelivered_next != nullptr) last = last->undelivered_next;
      last->undelivered_next = undelivered_;
      undelivered_ = jobs;
    }
    throw;
  }
  return out;
}

void Completions::free(Job* jobs) noexcept {
  while (Job* job = jobs) {
    jobs = job->undelivered_next;
    delete job;
  }
}

}  // namespace kvtier::detail
