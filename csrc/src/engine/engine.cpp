// The Engine facade: builds the parts an engine is made of (root, I/O context, staging,
// scheduler, completions, workers) and forwards each public call to the part that owns it.
// It also keeps a forked child from touching an engine whose workers live in the parent.
#include <kvtier/engine.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <kvtier/error.hpp>
#include <kvtier/files.hpp>

#include "device/cuda_runtime.hpp"
#include "device/staging_pool.hpp"
#include "engine/completions.hpp"
#include "engine/config_checks.hpp"
#include "engine/job.hpp"
#include "engine/numa.hpp"
#include "engine/scheduler.hpp"
#include "engine/settings.hpp"
#include "engine/worker.hpp"
#include "fs/beneath.hpp"
#include "fs/memory_fs.hpp"
#include "fs/process.hpp"
#include "io/block_io.hpp"
#include "io/ring.hpp"

namespace kvtier {
namespace detail {

/// Everything a worker's block operations touch, shared between the engine and its worker
/// threads: a worker abandoned inside the kernel (EngineConfig::io_timeout_s) keeps it alive
/// until it returns, so nothing it can touch is freed under it, even after the Engine is
/// destroyed. Its own buffers live on its own stack.
struct SharedIo {
  SharedIo(std::size_t staging_buffer_bytes, std::size_t staging_bytes_total)
      : staging(staging_buffer_bytes, staging_bytes_total) {}
  EngineSettings settings;  // the engine's, copied once they are final (make_io_context)
  RootDir root;
  StagingPool staging;
  IoContext io;
  AbandonGauges gauges;  // written by the watchdog and by abandoned workers as they return
};

/// A worker thread the engine started. Guarded by Impl::workers_mutex.
struct WorkerSlot {
  std::thread thread;
  WorkerPlacement placement;
  bool done = false;  // its body returned kStopped: join it
};

}  // namespace detail

inline namespace KVTIER_ABI_NAMESPACE {

struct KVTIER_HIDDEN Engine::Impl {
  // The process that started the workers. A child forked from it inherits this object but
  // none of its threads, and the mutexes below may have been held by threads that do not
  // exist there: see inherited().
  const pid_t owner = detail::current_pid();

  EngineConfig config;  // as validated, with the machine-sized defaults and the CUDA device
  detail::EngineSettings& settings = detail::settings_of(config);  // config's, for the core
  std::shared_ptr<detail::SharedIo> shared;
  detail::RootDir& root = shared->root;
  detail::StagingPool& staging = shared->staging;
  detail::IoContext& io = shared->io;
  bool direct = false;
  std::string fallback_reason;
  IoEngine io_engine = IoEngine::kPsync;  // the engine in use (never kAuto)
  std::string io_engine_fallback_reason;
  const detail::cuda::Api* cuda = nullptr;  // set when use_cuda found a runtime
  std::vector<int> numa_cpus;
  int numa_node = -1;

  detail::Completions completions;
  std::optional<detail::Scheduler> scheduler;  // made once the I/O engine is known
  std::mutex shutdown_mutex;                   // serialises shutdown() callers

  // The workers. With a deadline, a worker the watchdog abandons is detached and dropped from
  // `workers` (it exits by itself when the kernel returns) and replaced while at most
  // `worker_cap` abandoned workers are alive; `missing` holds the placements not replaced yet.
  std::mutex workers_mutex;
  std::condition_variable workers_changed;
  std::list<detail::WorkerSlot> workers;  // stable addresses: a slot is its worker's owner token
  std::deque<detail::WorkerPlacement> missing;
  unsigned worker_cap = 0;
  std::atomic<std::uint64_t> workers_replaced{0};
  std::thread watchdog;
  // Queues the jobs a submit left in the scheduler's inbox because its mutex was busy
  // (Scheduler::submit): at the caller's priority, so it preempts the store workers.
  std::thread intake;
  std::atomic<bool> intake_started{false};  // a member: the thread notifies after it is set

  explicit Impl(EngineConfig cfg)
      : config(std::move(cfg)),
        shared(std::make_shared<detail::SharedIo>(settings.staging_buffer_bytes,
                                                  settings.staging_bytes_total)) {}

  // Whether this is a forked child's copy: its workers never ran in this process, so nothing
  // may wait for them, or for a lock one of them might have held when the parent forked.
  bool inherited() const noexcept { return detail::current_pid() != owner; }

  [[noreturn]] void refuse_inherited() const {
    throw ForkedProcessError("kvtier engine was created in process " + std::to_string(owner) +
                             " and cannot be used in a process forked from it (pid " +
                             std::to_string(detail::current_pid()) +
                             "): its worker threads do not exist here; create a new engine "
                             "in this process, or start child processes with spawn/exec");
  }

  void open_root();
  void choose_io_engine();
  void start_cuda();
  void make_io_context();
  detail::SchedulerOptions scheduler_options() const;
  void start_workers();
  void spawn_worker(detail::WorkerPlacement placement);
  void run_watchdog();
  void replace(detail::WorkerSlot* slot);
  void stop_workers();
  void record_ready_event(detail::Job& job, void* cuda_stream) const;
};

// Creates and opens the root and, unless O_DIRECT is off, probes it.
void Engine::Impl::open_root() {
  const detail::EngineSettings& c = settings;
  root = detail::RootDir(c.root_dir, /*create=*/true, kvtier::directory_mode(c.file_mode));
  if (c.o_direct == ODirectMode::kOff) return;
  fallback_reason = probe_o_direct(c.root_dir);
  if (!fallback_reason.empty() && c.o_direct == ODirectMode::kOn)
    throw KVTIER_SYSTEM_ERROR(EINVAL, "o_direct=true but " + fallback_reason, c.root_dir);
  direct = fallback_reason.empty();
}

void Engine::Impl::choose_io_engine() {
  const detail::EngineSettings& c = settings;
  if (c.io_engine == IoEngine::kPsync) return;
  // The same answer the workers' rings will get: EPERM (sysctl kernel.io_uring_disabled,
  // seccomp), ENOSYS (no io_uring), EOPNOTSUPP (an opcode the block operations need).
  std::string reason;
  if (const int e = detail::probe_io_uring(reason)) {
    if (c.io_engine == IoEngine::kIoUring)
      throw KVTIER_ERROR_AT(IoUringRefusedError, e, "io_engine='io_uring' but " + reason,
                            c.root_dir);
    io_engine_fallback_reason = std::move(reason);
  } else {
    io_engine = IoEngine::kIoUring;
  }
}

// With use_cuda: the runtime, the device (the caller's current one by default), pinned
// staging and, with numa_bind, the GPU's NUMA node.
void Engine::Impl::start_cuda() {
  detail::EngineSettings& c = settings;
  if (!c.use_cuda) return;
  cuda = detail::cuda::runtime();
  if (cuda == nullptr)
    throw std::runtime_error("use_cuda is set but CUDA is unavailable: " +
                             detail::cuda::unavailable_reason());
  if (c.cuda_device < 0 && cuda->cudaGetDevice(&c.cuda_device) != detail::cuda::kSuccess)
    throw std::runtime_error("cudaGetDevice failed");
  if (c.cuda_device >= cuda->device_count)
    throw std::invalid_argument("cuda_device " + std::to_string(c.cuda_device) +
                                " does not exist (" + std::to_string(cuda->device_count) +
                                " devices)");
  staging.pin_with(cuda);
  if (c.numa_bind) numa_cpus = detail::gpu_numa_cpus(*cuda, c.cuda_device, numa_node);
}

void Engine::Impl::make_io_context() {
  // The workers read the shared copy: the engine's may be gone while one of them is abandoned.
  shared->settings = settings;
  io.config = &shared->settings;
  io.direct = direct;
  io.io_engine = io_engine;
  io.root = &root;
  io.root_memory = detail::RootMemory::of(root.fd());
  io.directory_mode = kvtier::directory_mode(settings.file_mode);
  io.staging = &staging;
  io.cuda = cuda;
  io.cuda_device = settings.cuda_device;
}

detail::SchedulerOptions Engine::Impl::scheduler_options() const {
  const detail::EngineSettings& c = settings;
  detail::SchedulerOptions options;
  // Without load-first workers, store-first workers must leave room for loads themselves:
  // one fewer store than there are workers, so a waiting load gets the next free worker.
  options.store_cap_while_loading =
      c.n_read_threads > 0 ? c.max_stores_in_flight_while_loading
                           : std::min(c.max_stores_in_flight_while_loading, c.n_write_threads - 1);
  options.store_cap_linger = std::chrono::milliseconds(c.store_cap_linger_ms);
  options.batch_blocks = io_engine == IoEngine::kIoUring;
  options.io_timeout = std::chrono::duration_cast<detail::Clock::duration>(
      std::chrono::duration<double>(c.io_timeout_s));
  options.gauges = &shared->gauges;
  return options;
}

// n_read_threads load-first workers, then n_write_threads store-first ones. Load-first
// workers run at load_nice unless they also take stores (no store-first worker exists).
void Engine::Impl::start_workers() {
  const detail::EngineSettings& c = settings;
  for (unsigned i = 0; i < c.n_read_threads + c.n_write_threads; ++i) {
    detail::WorkerPlacement placement;
    placement.role = i >= c.n_read_threads    ? detail::WorkerRole::kStoreFirst
                     : c.n_write_threads == 0 ? detail::WorkerRole::kLoadFirst
                                              : detail::WorkerRole::kLoadOnly;
    placement.nice = placement.role == detail::WorkerRole::kLoadOnly ? c.load_nice : c.worker_nice;
    placement.cpus = numa_cpus;
    std::lock_guard lock(workers_mutex);
    spawn_worker(std::move(placement));
  }
  worker_cap = c.n_read_threads + c.n_write_threads;
  if (c.io_timeout_s > 0) watchdog = std::thread([this] { run_watchdog(); });
  // Started before the constructor returns: a process that forks right after must not do
  // so while the thread is still inside its start-up (a sanitizer runtime's start-up takes
  // locks a child would then inherit held; the workers are waited for by their first batch).
  intake = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "kvtier-intake");
    intake_started.store(true, std::memory_order_release);
    intake_started.notify_one();
    scheduler->run_intake();
  });
  intake_started.wait(false, std::memory_order_acquire);
}

// Starts a worker (workers_mutex held). Its body holds the shared I/O state by value: once
// abandoned, it touches nothing else of the engine, which may be gone when it returns.
void Engine::Impl::spawn_worker(detail::WorkerPlacement placement) {
  detail::WorkerSlot& slot = workers.emplace_back();
  slot.placement = std::move(placement);
  try {
    slot.thread = std::thread(
        [this, io_state = shared, placement = slot.placement, owner = &slot] {
          std::size_t abandoned_blocks = 0;
          if (detail::run_worker(*scheduler, io_state->io, placement, owner, abandoned_blocks) ==
              detail::WorkerExit::kAbandoned) {
            io_state->gauges.returned(abandoned_blocks);
            return;  // `this` and `owner` may be gone
          }
          std::lock_guard lock(workers_mutex);
          owner->done = true;
          workers_changed.notify_all();
        });
  } catch (...) {
    workers.pop_back();
    throw;
  }
}

// The deadline's thread: times out batches stuck in the kernel (Scheduler::watch), then
// detaches their workers and replaces them, up to worker_cap abandoned workers alive.
void Engine::Impl::run_watchdog() {
  constexpr std::size_t kCapacity = 64;
  detail::Abandoned found[kCapacity];
  for (;;) {
    bool retry = false;
    {
      std::lock_guard lock(workers_mutex);
      retry = !missing.empty();
    }
    // Missing workers are retried as abandoned ones return (they tell nobody: poll).
    const auto poll = retry ? std::chrono::milliseconds(50) : std::chrono::milliseconds(1000);
    const std::size_t n = scheduler->watch(found, kCapacity, poll);
    if (scheduler->watchdog_stopped()) return;
    std::lock_guard lock(workers_mutex);
    for (std::size_t i = 0; i < n; ++i) replace(static_cast<detail::WorkerSlot*>(found[i].owner));
    while (!missing.empty() && !scheduler->stopped() &&
           shared->gauges.workers_stuck() <= worker_cap) {
      try {
        spawn_worker(missing.front());
      } catch (...) {
        break;  // no thread now (resources): tried again at the next poll
      }
      missing.pop_front();
      workers_replaced.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

// An abandoned worker's slot (workers_mutex held): its thread is detached and forgotten, and
// its placement waits for a replacement unless the engine is stopping.
void Engine::Impl::replace(detail::WorkerSlot* slot) {
  auto it = std::find_if(workers.begin(), workers.end(),
                         [slot](const detail::WorkerSlot& s) { return &s == slot; });
  if (it == workers.end()) return;
  it->thread.detach();
  if (!scheduler->stopped()) missing.push_back(std::move(it->placement));
  workers.erase(it);
  workers_changed.notify_all();
}

// shutdown()'s wait: every worker exits (it finished its batch) or is abandoned by the
// watchdog (at most io_timeout_s after its batch began); then the watchdog stops.
// Allocates nothing (see "Never abort" in docs/core.md): the slots are spliced, not copied.
void Engine::Impl::stop_workers() {
  std::list<detail::WorkerSlot> exited;
  {
    std::unique_lock lock(workers_mutex);
    workers_changed.wait(lock, [&] {
      return std::all_of(workers.begin(), workers.end(),
                         [](const detail::WorkerSlot& s) { return s.done; });
    });
    missing.clear();
    exited.splice(exited.end(), workers);
  }
  for (detail::WorkerSlot& s : exited)
    if (s.thread.joinable()) s.thread.join();
  if (watchdog.joinable()) {
    scheduler->stop_watchdog();
    watchdog.join();
  }
  // Last: until stop() every submit that found the mutex busy relied on it (from then on a
  // submit queues nothing, or cancels its job itself).
  if (intake.joinable()) {
    scheduler->stop_intake();
    intake.join();
  }
}

// Device copies are ordered after everything already queued on the caller's stream: a store
// must see the kernel that wrote the block, a load must not overwrite a block that queued
// kernels still read. The workers wait on this event before copying. It is made on the
// engine's device, whichever device the calling thread has current.
void Engine::Impl::record_ready_event(detail::Job& job, void* cuda_stream) const {
  job.cuda = cuda;
  const detail::cuda::Error e = detail::cuda::record_event_on(
      *cuda, settings.cuda_device, static_cast<detail::cuda::Stream>(cuda_stream), job.ready);
  if (e != detail::cuda::kSuccess) {
    cuda->cudaGetLastError();
    throw std::runtime_error("cannot record the submitting stream's event: " +
                             detail::cuda::describe(*cuda, e));
  }
}

Engine::Engine(EngineConfig config)
    : impl_(std::make_unique<Impl>(detail::validated(std::move(config)))) {
  Impl& s = *impl_;
  s.open_root();
  s.choose_io_engine();
  s.start_cuda();
  if (s.settings.completion_eventfd) s.completions.open_eventfd();
  s.make_io_context();
  s.scheduler.emplace(s.scheduler_options(), s.completions);
  try {
    s.start_workers();
  } catch (...) {
    shutdown();
    throw;
  }
}

Engine::~Engine() {
  if (impl_->inherited()) {
    // The std::thread objects name threads that do not exist here: joining or destroying
    // them is undefined (a crash, or std::terminate), and a queue mutex may be locked for
    // ever. The child's copy of the engine is left as it is: memory the child's exit frees,
    // and a few descriptors (root, rings), of which the completion eventfd is closed.
    impl_->completions.close_eventfd();
    (void)impl_.release();
    return;
  }
  shutdown();
  // Impl's destructor frees the completions not popped (Completions::~Completions).
}

void Engine::submit(JobId job_id, Direction direction, std::vector<BlockOp> blocks,
                    void* cuda_stream) {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  const bool any_device = detail::check_blocks(blocks, direction, s.cuda != nullptr);
  std::unique_ptr<detail::Job> job = detail::make_job(job_id, direction, std::move(blocks));
  if (any_device) s.record_ready_event(*job, cuda_stream);
  s.scheduler->submit(std::move(job));
}

std::vector<Completion> Engine::pop_completions(std::size_t max) {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  return s.completions.pop(
      max, [&s](const detail::Job* delivered) { s.scheduler->release_ids(delivered); });
}

void Engine::drain() {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  s.scheduler->drain();
}

bool Engine::drain_for(double timeout_s) {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  if (!(timeout_s >= 0)) throw std::invalid_argument("drain_for: timeout_s must be >= 0");
  // Capped at a day: converting a huge double to the clock's ticks would overflow.
  const auto limit = std::chrono::duration<double>(std::min(timeout_s, 86400.0));
  return s.scheduler->drain_for(std::chrono::duration_cast<detail::Clock::duration>(limit));
}

void Engine::shutdown() {
  Impl& s = *impl_;
  if (s.inherited()) return;  // nothing of it runs in this process: nothing to stop
  std::lock_guard serial(s.shutdown_mutex);
  s.scheduler->stop();
  s.stop_workers();
  s.staging.release_all();  // buffers on loan to abandoned workers come back, freed later
  // Nothing runs a block operation any more (a later submit is refused): let go of the root
  // directory, so the volume it lies on can be unmounted without dropping the engine. An
  // abandoned worker may still resolve a path from it when the kernel returns: then the last
  // of them closes it (SharedIo).
  if (s.shared->gauges.workers_stuck() == 0) s.root = detail::RootDir();
}

std::size_t Engine::fail_unstarted(const std::string& directory) {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  if (directory.empty()) throw std::invalid_argument("fail_unstarted: directory must not be empty");
  std::string_view dir = directory;
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  return s.scheduler->fail_unstarted(dir);
}

bool Engine::is_shut_down() const noexcept {
  if (impl_->inherited()) return true;  // refuses every job in this process
  return impl_->scheduler->stopped();
}

bool Engine::direct_io() const noexcept {
  return impl_->direct;
}
const std::string& Engine::o_direct_fallback_reason() const noexcept {
  return impl_->fallback_reason;
}
IoEngine Engine::io_engine() const noexcept {
  return impl_->io_engine;
}
const std::string& Engine::io_engine_fallback_reason() const noexcept {
  return impl_->io_engine_fallback_reason;
}
int Engine::completion_eventfd() const noexcept {
  return impl_->completions.eventfd();
}
bool Engine::cuda_enabled() const noexcept {
  return impl_->cuda != nullptr;
}
int Engine::numa_node() const noexcept {
  return impl_->numa_node;
}
const EngineConfig& Engine::config() const noexcept {
  return impl_->config;
}

EngineStats Engine::stats() const {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  EngineStats st;
  s.scheduler->stats(st);
  st.abandoned_ops = s.shared->gauges.abandoned_ops();
  st.workers_stuck = s.shared->gauges.workers_stuck();
  st.workers_replaced = s.workers_replaced.load(std::memory_order_relaxed);
  return st;
}

bool cuda_available() noexcept {
  return detail::cuda::runtime() != nullptr;
}

std::string cuda_unavailable_reason() {
  return detail::cuda::unavailable_reason();
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
