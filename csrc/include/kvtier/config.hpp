#pragma once

#include <sys/types.h>
#include <cstddef>
#include <cstdint>
#include <string>

#include <kvtier/format.hpp>
#include <kvtier/thread_defaults.hpp>

namespace kvtier {

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
  kIoUring,  ///< require io_uring; the Engine constructor throws SystemError (the kernel's
             ///< errno: EPERM when disabled by sysctl or seccomp, ENOSYS without io_uring)
  kPsync,    ///< pread/pwrite system calls from the worker threads
};

/// Everything an Engine needs; every field has a usable default.
struct EngineConfig {
  /// Required. Every block path must lie below it (others fail with EPERM); it is created
  /// if missing, probed for O_DIRECT, and block paths are resolved from it without following
  /// any symbolic link below it.
  std::string root_dir;
  /// Workers that take loads (and stores only when n_write_threads is 0). kMachineThreads:
  /// machine_thread_counts(root_dir) at construction (Engine::config() shows the count).
  unsigned n_read_threads = kMachineThreads;
  /// Workers that take stores first (and loads when no store waits). kMachineThreads as above.
  unsigned n_write_threads = kMachineThreads;
  ODirectMode o_direct = ODirectMode::kAuto;
  Checksum checksum = Checksum::kCrc32c;
  /// With io_uring each worker owns a ring and submits up to 8 blocks of one job (2 MiB of
  /// payload; stores only while no load waits) in one io_uring_enter, each block a linked
  /// chain (store: writev, [fdatasync], close, rename; load: readv, close).
  IoEngine io_engine = IoEngine::kAuto;
  Durability durability = Durability::kNone;
  /// Permission bits of new block files (block files reveal prompts: private by default);
  /// directories the engine creates get kvtier::directory_mode(file_mode).
  mode_t file_mode = 0600;
  /// Identifies the layout the bytes were written for; a load of a file written with a
  /// different fingerprint fails. At most kFingerprintSize bytes.
  std::string fingerprint;
  /// While loads are queued or running, and for store_cap_linger_ms after the last load
  /// finished, at most this many store operations run at once, so a load waits only for the
  /// few writes already at the device, also when an engine issues one small load at a time.
  unsigned max_stores_in_flight_while_loading = 2;
  /// How long the store cap outlasts the last load (0: only while loads wait or run). An
  /// engine that loads one job per step submits the next within a step or two.
  unsigned store_cap_linger_ms = 100;
  /// Upper bound on the page-aligned staging buffers (allocated on first use) that carry
  /// payloads in unaligned host memory under O_DIRECT, and device memory.
  std::size_t staging_bytes_total = std::size_t{64} << 20;
  /// Size of one staging buffer; larger payloads move through it in pieces.
  std::size_t staging_buffer_bytes = std::size_t{2} << 20;
  /// Load the CUDA runtime so that segments may be MemoryKind::kDevice (the constructor throws
  /// std::runtime_error when no runtime or device is found); staging buffers are then pinned.
  bool use_cuda = false;
  /// Device that kDevice segments live on; -1 = the caller's current device at construction.
  int cuda_device = -1;
  /// Nice value (0 to 19) of the worker threads. Their work is background I/O; a positive
  /// value keeps them from taking CPU away from the engine's scheduler loop on busy hosts, and
  /// costs nothing while cores are idle.
  int worker_nice = 19;
  /// Nice value (0 to 19) of the load-only workers (n_read_threads, when n_write_threads > 0).
  /// A load is what a request waits for, so by default it runs at the caller's priority,
  /// above the stores; an unprivileged thread cannot lower its nice value again, so workers
  /// keep one priority for life and the load-only ones never run stores.
  int load_nice = 0;
  /// Pin worker threads to the CPUs of the GPU's NUMA node, where the system exposes it.
  bool numa_bind = false;
  /// Create an eventfd that is signalled whenever a completion is published.
  bool completion_eventfd = false;
};

/// Parses "auto" / "true" / "false" (and "on"/"off"/"1"/"0"); throws std::invalid_argument.
ODirectMode parse_o_direct(const std::string& text);
/// Parses "crc32c" / "none"; throws std::invalid_argument.
Checksum parse_checksum(const std::string& text);
/// Parses "none" / "data" / "full"; throws std::invalid_argument.
Durability parse_durability(const std::string& text);
/// Parses "auto" / "io_uring" / "psync"; throws std::invalid_argument.
IoEngine parse_io_engine(const std::string& text);

const char* to_string(ODirectMode mode) noexcept;
const char* to_string(Checksum checksum) noexcept;
const char* to_string(Durability durability) noexcept;
const char* to_string(IoEngine engine) noexcept;

}  // namespace kvtier
