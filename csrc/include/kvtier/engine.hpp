#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kvtier/config.hpp>
#include <kvtier/job.hpp>

namespace kvtier {

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
};

/// A pool of worker threads that stores and loads KV blocks as files.
///
/// Thread safety: submit(), drain(), shutdown() and stats() may be called from any thread;
/// pop_completions() from one thread at a time.
class Engine {
 public:
  /// Starts the workers and, for ODirectMode::kAuto / kOn, probes config.root_dir.
  /// Throws std::invalid_argument for a bad configuration, SystemError when kOn is asked
  /// for and the root does not support O_DIRECT (or cannot be probed).
  explicit Engine(EngineConfig config);
  /// Shuts down (see shutdown()) and frees everything.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a job. Returns at once; the job is reported exactly once by pop_completions().
  /// A job without blocks completes immediately and successfully.
  /// `cuda_stream` (a cudaStream_t of EngineConfig::cuda_device; nullptr = that device's
  /// legacy default stream) matters for jobs over device memory: their copies (device to
  /// staging for stores, staging to device for loads) start only after the work queued on
  /// that stream so far has finished. The calling thread's current device is left unchanged.
  /// Throws std::invalid_argument for a job id already in flight or a bad block (null data,
  /// empty path, oversized key, device memory without use_cuda), std::runtime_error after
  /// shutdown() or when CUDA fails to record the stream's event. A job that throws is never
  /// reported.
  void submit(JobId job_id, Direction direction, std::vector<BlockOp> blocks,
              void* cuda_stream = nullptr);

  /// Moves up to `max` finished jobs (0 = all available) into the result. Never blocks.
  std::vector<Completion> pop_completions(std::size_t max = 0);

  /// Blocks until every job submitted so far has completed (not necessarily popped).
  void drain();

  /// Stops the workers: running block operations finish, every block not yet started fails
  /// with ECANCELED (its job is still reported), threads are joined. Idempotent. Completions
  /// not yet popped remain available.
  void shutdown();

  bool is_shut_down() const noexcept;

  /// Whether block files are opened with O_DIRECT (after the probe of ODirectMode::kAuto).
  bool direct_io() const noexcept;
  /// Why ODirectMode::kAuto fell back to buffered I/O; empty when it did not.
  const std::string& o_direct_fallback_reason() const noexcept;

  /// A non-blocking eventfd signalled on every completion, or -1 unless
  /// EngineConfig::completion_eventfd was set. Read it to reset it.
  int completion_eventfd() const noexcept;

  /// Whether device memory can be moved (EngineConfig::use_cuda and a runtime was found).
  bool cuda_enabled() const noexcept;
  /// The NUMA node the workers are pinned to, or -1.
  int numa_node() const noexcept;

  EngineStats stats() const;
  const EngineConfig& config() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Whether a CUDA runtime and at least one device are present in this process.
bool cuda_available() noexcept;
/// Why cuda_available() is false (empty when it is true).
std::string cuda_unavailable_reason();

/// Tries to create, O_DIRECT-write and read a probe file in `dir`.
/// Returns an empty string when O_DIRECT works, else the reason it does not.
std::string probe_o_direct(const std::string& dir);

}  // namespace kvtier
