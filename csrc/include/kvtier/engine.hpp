#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kvtier/config.hpp>
#include <kvtier/export.hpp>
#include <kvtier/job.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// Counters since the engine started (a consistent-enough snapshot, not atomic as a whole).
struct EngineStats {
  std::uint64_t load_jobs = 0, store_jobs = 0;  ///< jobs completed
  std::uint64_t failed_load_jobs = 0, failed_store_jobs = 0;
  std::uint64_t load_blocks = 0, store_blocks = 0;  ///< blocks completed successfully
  std::uint64_t failed_load_blocks = 0, failed_store_blocks = 0;
  std::uint64_t load_bytes = 0, store_bytes = 0;  ///< payload bytes moved
  std::uint64_t dedup_skips = 0;  ///< stores skipped because the file already existed
  std::uint64_t corrupt_files_removed = 0;
  std::uint64_t o_direct_fallbacks = 0;  ///< opens that fell back from O_DIRECT to buffered
  std::uint64_t queued_loads = 0, queued_stores = 0;    ///< block operations waiting
  std::uint64_t running_loads = 0, running_stores = 0;  ///< block operations running
  std::uint64_t jobs_in_flight = 0;                     ///< submitted, not yet completed
  /// Workers that gave their io_uring up because io_uring_enter kept failing (they go on
  /// with pread/pwrite), and the errno it answered the last time that happened (0: never).
  std::uint64_t io_uring_rings_retired = 0;
  int io_uring_retired_errno = 0;
  /// EngineConfig::io_timeout_s: block operations failed with ETIMEDOUT by their deadline
  /// (cumulative), operations abandoned and still inside the kernel (now), workers started to
  /// replace stuck ones (cumulative), workers stuck in an abandoned operation (now).
  /// (Appended in 0.1: a program built against an older 0.1 header sees a shorter struct.)
  std::uint64_t io_timeouts = 0;
  std::uint64_t abandoned_ops = 0;
  std::uint64_t workers_replaced = 0;
  std::uint64_t workers_stuck = 0;
  /// Blocks loaded under io_timeout_s straight into the caller's memory, without the worker's
  /// own copy, because their file holds only memory (ramfs, or tmpfs without swap; see
  /// docs/core.md). (Appended in 0.1, as the fields above.)
  std::uint64_t memory_fs_loads = 0;
  /// Jobs whose submit found the scheduler busy and left them to the engine's intake thread
  /// instead of waiting (docs/core.md, "Threads and the life of a job"); cumulative.
  /// (Appended in 0.1, as the fields above.)
  std::uint64_t intake_submits = 0;
  /// Times the deadline's watchdog found it had not run for more than a tick with block
  /// operations under a deadline (this process stopped or frozen, or starved of CPU) and gave
  /// them that time back (docs/core.md, "I/O deadlines"); cumulative. (Appended in 0.1, as
  /// the fields above.)
  std::uint64_t watchdog_pauses = 0;
  /// Blocks stored under io_timeout_s straight from the caller's memory, without the
  /// worker's own copy, because their tmp file landed on a file system that holds only memory
  /// (as memory_fs_loads; docs/core.md, "Stores to memory"). (Appended in 0.1, as the fields
  /// above.)
  std::uint64_t memory_fs_stores = 0;
};

/// A pool of worker threads that stores and loads KV blocks as files.
///
/// Thread safety: every member may be called from any number of threads at once
/// (pop_completions() callers take turns; each job is reported to exactly one of them).
///
/// fork(): a child inherits none of the workers. There the engine refuses every job
/// (submit, pop_completions, drain and stats throw ForkedProcessError), is_shut_down() is
/// true, shutdown() does nothing, and the destructor frees only the completion eventfd (the
/// rest of the child's copy goes when the child exits). The parent's engine is unaffected.
///
/// Read-after-write: a load block whose path has a store block submitted earlier to this
/// engine and not yet finished waits (parked, without occupying a worker) until no store of
/// that path is pending, then reads the file those stores left (or misses, when they failed).
/// Paths are compared as strings.
class KVTIER_EXPORT Engine {
 public:
  /// Creates (with directory_mode(file_mode)) and opens config.root_dir, starts the workers
  /// and, for ODirectMode::kAuto / kOn, probes the root. Block paths must lie below the root.
  /// Throws std::invalid_argument for a bad configuration (an empty root_dir too),
  /// SystemError when the root cannot be created or opened, or when kOn is asked for and the
  /// root does not support O_DIRECT (or cannot be probed), IoUringRefusedError when
  /// IoEngine::kIoUring is asked for and the kernel refuses io_uring, std::runtime_error when
  /// use_cuda finds no CUDA runtime or device.
  explicit Engine(EngineConfig config);
  /// Shuts down (see shutdown()) and frees everything.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a job. Returns at once; the job is reported exactly once by pop_completions().
  /// A job without blocks completes successfully without any I/O: it is poppable when submit()
  /// returns, or moments later when the submit found the scheduler busy and left the job to
  /// the engine's intake thread (which submit never waits for); drain() waits for it.
  /// `cuda_stream` (a cudaStream_t of EngineConfig::cuda_device; nullptr = that device's
  /// legacy default stream) matters for jobs over device memory: their copies (device to
  /// staging for stores, staging to device for loads) start only after the work queued on
  /// that stream so far has finished. The calling thread's current device is left unchanged.
  /// Throws std::invalid_argument for a job id already in flight or a bad block (null data,
  /// empty path, oversized key, device memory without use_cuda), EngineShutDownError after
  /// shutdown(), std::runtime_error when CUDA fails to record the stream's event,
  /// std::bad_alloc when memory runs out. All or nothing: a submit that throws queued nothing, is
  /// never reported, and leaves the job id free.
  void submit(JobId job_id, Direction direction, std::vector<BlockOp> blocks,
              void* cuda_stream = nullptr);

  /// Moves up to `max` finished jobs (0 = all available) into the result. Never waits for a
  /// job (only, briefly, for a concurrent caller). Throws std::bad_alloc when the result
  /// cannot be allocated; the jobs it would have held are then reported by a later call.
  std::vector<Completion> pop_completions(std::size_t max = 0);

  /// Blocks until every job submitted before the call (by any thread) has completed; its
  /// completion is then poppable. Jobs submitted during the wait are not waited for, so
  /// drain() returns even while other threads keep submitting.
  void drain();
  /// drain() for at most `timeout_s` seconds: true when every job submitted before the call
  /// has completed, false when the time ran out first (for a caller that must act meanwhile,
  /// e.g. collect completions that tell it the storage stalled). Throws
  /// std::invalid_argument for a negative or NaN `timeout_s`.
  bool drain_for(double timeout_s);

  /// Stops the workers: running block operations finish, every block not yet started fails
  /// with ECANCELED (its job is still reported), threads are joined. With io_timeout_s > 0 an
  /// operation still in the kernel at its deadline fails with ETIMEDOUT and its thread is
  /// detached instead (it exits by itself when the kernel returns), so this returns within
  /// about io_timeout_s. Idempotent. Completions not yet popped remain available.
  void shutdown();

  bool is_shut_down() const noexcept;

  /// Fails every block not yet started whose path lies beneath `directory` (an absolute
  /// path, compared as a string: a trailing slash is ignored) with ETIMEDOUT, without
  /// stopping the engine: queued loads and stores, and loads waiting for a store of their
  /// path. For a caller that found the storage under `directory` stalled (the Python tiers
  /// call it when a root becomes degraded): those blocks would otherwise wait for workers
  /// stuck in the kernel. A job is reported at once when that leaves none of its blocks to
  /// run; blocks already running keep their deadline (io_timeout_s), blocks elsewhere run as
  /// usual, and a failed block never runs later. Returns how many blocks failed (0 after
  /// shutdown()). Throws std::invalid_argument for an empty `directory`, ForkedProcessError
  /// in a forked child.
  std::size_t fail_unstarted(const std::string& directory);

  /// Whether block files are opened with O_DIRECT (after the probe of ODirectMode::kAuto).
  bool direct_io() const noexcept;
  /// Why ODirectMode::kAuto fell back to buffered I/O; empty when it did not.
  const std::string& o_direct_fallback_reason() const noexcept;

  /// The engine that moves the bytes: IoEngine::kIoUring or IoEngine::kPsync (never kAuto).
  IoEngine io_engine() const noexcept;
  /// Why IoEngine::kAuto chose psync (the kernel's refusal of io_uring); empty when it did not.
  const std::string& io_engine_fallback_reason() const noexcept;

  /// A non-blocking eventfd signalled on every completion, or -1 unless
  /// EngineConfig::completion_eventfd was set. Read it to reset it.
  int completion_eventfd() const noexcept;

  /// Whether device memory can be moved (EngineConfig::use_cuda and a runtime was found).
  bool cuda_enabled() const noexcept;
  /// The NUMA node the workers are pinned to, or -1.
  int numa_node() const noexcept;

  /// Counters and queue depths. Throws ForkedProcessError in a forked child.
  EngineStats stats() const;
  /// The configuration the engine runs with: as given, with the machine-sized thread counts
  /// and the CUDA device resolved.
  const EngineConfig& config() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Whether a CUDA runtime and at least one device are present in this process.
KVTIER_EXPORT bool cuda_available() noexcept;
/// Why cuda_available() is false (empty when it is true).
KVTIER_EXPORT std::string cuda_unavailable_reason();

/// Tries to create, O_DIRECT-write and read a probe file in `dir`.
/// Returns an empty string when O_DIRECT works, else the reason it does not.
KVTIER_EXPORT std::string probe_o_direct(const std::string& dir);

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
