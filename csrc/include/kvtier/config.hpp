#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <kvtier/export.hpp>
#include <kvtier/format.hpp>
#include <kvtier/thread_defaults.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
namespace detail {  // internals, outside the ABI namespace: see EngineConfig
struct EngineSettings;
struct SettingsAccess;
}  // namespace detail
inline namespace KVTIER_ABI_NAMESPACE {

/// The ranges of EngineConfig fields the Engine constructor accepts (it throws
/// std::invalid_argument outside them). The one definition: the constructor's checks use these
/// constants, and Python reads them through kvtier._core.ENGINE_LIMITS.
namespace limits {
/// n_read_threads and n_write_threads, each (after kMachineThreads is resolved).
inline constexpr unsigned kMaxThreads = 1024;
/// n_read_threads + n_write_threads: at least one worker.
inline constexpr unsigned kMinThreadsTotal = 1;
/// worker_nice and load_nice.
inline constexpr int kMinNice = 0;
inline constexpr int kMaxNice = 19;
/// max_stores_in_flight_while_loading.
inline constexpr unsigned kMinStoresInFlightWhileLoading = 1;
/// staging_buffer_bytes is a positive multiple of this; staging_bytes_total holds at least one
/// staging buffer.
inline constexpr std::size_t kStagingBufferMultiple = kAlignment;
/// file_mode holds permission bits only, and always these (the owner reads and writes).
inline constexpr mode_t kFileModeBits = 07777;
inline constexpr mode_t kFileModeRequiredBits = 0600;
/// io_timeout_s: finite and not negative (0 disables the deadline); at most a day.
inline constexpr double kMinIoTimeoutSeconds = 0.0;
inline constexpr double kMaxIoTimeoutSeconds = 86400.0;
}  // namespace limits

/// Whether block files are opened with O_DIRECT.
enum class ODirectMode {
  kAuto,  ///< probe the root once; fall back to buffered I/O if unsupported
  kOn,    ///< require O_DIRECT; the Engine constructor throws if unsupported
  kOff,   ///< always buffered I/O
};

/// What protects a block's payload (the header always carries its own CRC32C).
enum class Checksum { kCrc32c, kNone };

/// How far a store goes to survive a power loss before it is reported done.
enum class Durability {
  kNone,  ///< rely on the page cache / O_DIRECT device write
  kData,  ///< fdatasync the block file before renaming it into place
  kFull,  ///< kData, and fsync the directory after the rename
};

/// How block files are read and written. Both engines write the same files and report the
/// same failures; io_uring needs no liburing (the core makes the system calls itself).
enum class IoEngine {
  kAuto,     ///< io_uring where the kernel allows it, otherwise psync (the reason is kept)
  kIoUring,  ///< require io_uring; the Engine constructor throws IoUringRefusedError (a
             ///< SystemError with the kernel's errno: EPERM when disabled by sysctl or
             ///< seccomp, ENOSYS without io_uring)
  kPsync,    ///< pread/pwrite system calls from the worker threads
};

/// Everything an Engine needs; every setting has a usable default. Each setting has a getter
/// and a setter (which returns the config, so setters chain):
///
///     kvtier::EngineConfig config;
///     config.set_root_dir("/mnt/nvme/kv").set_n_read_threads(4).set_durability(
///         kvtier::Durability::kData);
///
/// The settings live behind a pointer: new ones are new functions, so programs built against
/// an older release of the same minor version keep working with a newer library. Values are
/// checked by the Engine constructor (std::invalid_argument; ranges in kvtier::limits), not
/// by the setters. Copyable; a copy is independent of the original.
class KVTIER_EXPORT EngineConfig {
 public:
  EngineConfig();
  ~EngineConfig();
  EngineConfig(const EngineConfig& other);
  EngineConfig& operator=(const EngineConfig& other);

  /// Required. Every block path must lie below it (others fail with EPERM); it is created if
  /// missing, probed for O_DIRECT, and block paths are resolved from it without following any
  /// symbolic link below it.
  const std::string& root_dir() const noexcept;
  EngineConfig& set_root_dir(std::string value);

  /// Workers that take loads (and stores only when n_write_threads is 0). kMachineThreads (the
  /// default): machine_thread_counts(root_dir) at construction (Engine::config() shows the
  /// count).
  unsigned n_read_threads() const noexcept;
  EngineConfig& set_n_read_threads(unsigned value);

  /// Workers that take stores first (and loads when no store waits). kMachineThreads (the
  /// default) as above.
  unsigned n_write_threads() const noexcept;
  EngineConfig& set_n_write_threads(unsigned value);

  /// Default kAuto.
  ODirectMode o_direct() const noexcept;
  EngineConfig& set_o_direct(ODirectMode value);

  /// Default kCrc32c.
  Checksum checksum() const noexcept;
  EngineConfig& set_checksum(Checksum value);

  /// Default kAuto. With io_uring each worker owns a ring and submits up to 8 blocks of one
  /// job (2 MiB of payload; stores only while no load waits) in one io_uring_enter, each block
  /// a linked chain (store: writev, [fdatasync], close, rename; load: readv, close).
  IoEngine io_engine() const noexcept;
  EngineConfig& set_io_engine(IoEngine value);

  /// Default kNone.
  Durability durability() const noexcept;
  EngineConfig& set_durability(Durability value);

  /// Permission bits of new block files (default 0600: block files reveal prompts);
  /// directories the engine creates get kvtier::directory_mode(file_mode).
  mode_t file_mode() const noexcept;
  EngineConfig& set_file_mode(mode_t value);

  /// Identifies the layout the bytes were written for; a load of a file written with a
  /// different fingerprint fails. At most kFingerprintSize bytes (default empty).
  const std::string& fingerprint() const noexcept;
  EngineConfig& set_fingerprint(std::string value);

  /// While loads are queued or running, and for store_cap_linger_ms after the last load
  /// finished, at most this many store operations run at once (default 1), so a load waits
  /// only for the write already at the device, also when an engine issues one small load at a
  /// time. A second store in flight lets stores get 1.5-2x as much done while loads run, and
  /// adds a write to every load's wait (docs/PERFORMANCE.md, section 29).
  unsigned max_stores_in_flight_while_loading() const noexcept;
  EngineConfig& set_max_stores_in_flight_while_loading(unsigned value);

  /// How long the store cap outlasts the last load (default 100; 0: only while loads wait or
  /// run). An engine that loads one job per step submits the next within a step or two.
  unsigned store_cap_linger_ms() const noexcept;
  EngineConfig& set_store_cap_linger_ms(unsigned value);

  /// Upper bound on the page-aligned staging buffers (allocated on first use) that carry
  /// payloads in unaligned host memory under O_DIRECT, and device memory. Default 64 MiB.
  std::size_t staging_bytes_total() const noexcept;
  EngineConfig& set_staging_bytes_total(std::size_t value);

  /// Size of one staging buffer (default 2 MiB); larger payloads move through it in pieces.
  std::size_t staging_buffer_bytes() const noexcept;
  EngineConfig& set_staging_buffer_bytes(std::size_t value);

  /// Load the CUDA runtime so that segments may be MemoryKind::kDevice (the constructor
  /// throws std::runtime_error when no runtime or device is found); staging buffers are then
  /// pinned. Default false.
  bool use_cuda() const noexcept;
  EngineConfig& set_use_cuda(bool value);

  /// Device that kDevice segments live on; -1 (the default) = the caller's current device at
  /// construction.
  int cuda_device() const noexcept;
  EngineConfig& set_cuda_device(int value);

  /// Nice value (0 to 19, default 19) of the worker threads. Their work is background I/O; a
  /// positive value keeps them from taking CPU away from the engine's scheduler loop on busy
  /// hosts, and costs nothing while cores are idle. Store-first workers also ask for a long
  /// EEVDF slice (Linux 6.12+), so that any thread waking with the default slice preempts
  /// them at once; that changes latency, not the CPU share nice sets.
  int worker_nice() const noexcept;
  EngineConfig& set_worker_nice(int value);

  /// Nice value (0 to 19, default 0) of the load-only workers (n_read_threads, when
  /// n_write_threads > 0). A load is what a request waits for, so by default it runs at the
  /// caller's priority, above the stores; an unprivileged thread cannot lower its nice value
  /// again, so workers keep one priority for life and the load-only ones never run stores.
  int load_nice() const noexcept;
  EngineConfig& set_load_nice(int value);

  /// Pin worker threads to the CPUs of the GPU's NUMA node, where the system exposes it.
  /// Default false.
  bool numa_bind() const noexcept;
  EngineConfig& set_numa_bind(bool value);

  /// Create an eventfd that is signalled whenever a completion is published. Default false.
  bool completion_eventfd() const noexcept;
  EngineConfig& set_completion_eventfd(bool value);

  /// Deadline of one block operation, in seconds from the moment a worker starts it (default
  /// 10; 0: no deadline). An operation still inside the kernel then fails its job's block with
  /// ETIMEDOUT, the job is reported at once, and the engine stops waiting for it: the worker is
  /// abandoned (it frees its own buffers when the kernel returns) and replaced. While the
  /// deadline is on, payloads move through buffers the engine owns (one extra memory copy per
  /// block), so a late kernel answer never touches the caller's memory. Range:
  /// [limits::kMinIoTimeoutSeconds, limits::kMaxIoTimeoutSeconds], finite.
  double io_timeout_s() const noexcept;
  EngineConfig& set_io_timeout_s(double value);

 private:
  friend struct detail::SettingsAccess;
  std::unique_ptr<detail::EngineSettings> settings_;
};

/// Parses "auto" / "true" / "false" (and "on"/"off"/"1"/"0"); throws std::invalid_argument.
KVTIER_EXPORT ODirectMode parse_o_direct(const std::string& text);
/// Parses "crc32c" / "none"; throws std::invalid_argument.
KVTIER_EXPORT Checksum parse_checksum(const std::string& text);
/// Parses "none" / "data" / "full"; throws std::invalid_argument.
KVTIER_EXPORT Durability parse_durability(const std::string& text);
/// Parses "auto" / "io_uring" / "psync"; throws std::invalid_argument.
KVTIER_EXPORT IoEngine parse_io_engine(const std::string& text);

KVTIER_EXPORT const char* to_string(ODirectMode mode) noexcept;
KVTIER_EXPORT const char* to_string(Checksum checksum) noexcept;
KVTIER_EXPORT const char* to_string(Durability durability) noexcept;
KVTIER_EXPORT const char* to_string(IoEngine engine) noexcept;

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
