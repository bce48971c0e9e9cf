#include "engine/config_checks.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include <kvtier/format.hpp>
#include <kvtier/thread_defaults.hpp>

#include "engine/settings.hpp"

namespace kvtier::detail {
namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument(what);
}

void check_threads(const EngineSettings& c) {
  if (c.n_read_threads + c.n_write_threads < limits::kMinThreadsTotal)
    refuse("n_read_threads + n_write_threads must be at least " +
           std::to_string(limits::kMinThreadsTotal));
  if (c.n_read_threads > limits::kMaxThreads || c.n_write_threads > limits::kMaxThreads)
    refuse("n_read_threads and n_write_threads must be at most " +
           std::to_string(limits::kMaxThreads));
}

void check_staging(const EngineSettings& c) {
  if (c.staging_buffer_bytes < limits::kStagingBufferMultiple ||
      c.staging_buffer_bytes % limits::kStagingBufferMultiple != 0)
    refuse("staging_buffer_bytes must be a positive multiple of " +
           std::to_string(limits::kStagingBufferMultiple));
  if (c.staging_bytes_total < c.staging_buffer_bytes)
    refuse("staging_bytes_total must hold at least one staging buffer");
}

void check_nice(const char* name, int value) {
  if (value < limits::kMinNice || value > limits::kMaxNice)
    refuse(std::string(name) + " must be in [" + std::to_string(limits::kMinNice) + ", " +
           std::to_string(limits::kMaxNice) + "]");
}

void check_file_mode(mode_t mode) {
  if ((mode & ~limits::kFileModeBits) != 0)
    refuse("file_mode must be permission bits (0 to 0o7777)");
  if ((mode & limits::kFileModeRequiredBits) != limits::kFileModeRequiredBits)
    refuse("file_mode must let the owner read and write (include 0o600)");
}

void check_io_timeout(double seconds) {
  // NaN fails both comparisons, so it is refused by the negated range test.
  if (!std::isfinite(seconds) ||
      !(seconds >= limits::kMinIoTimeoutSeconds && seconds <= limits::kMaxIoTimeoutSeconds)) {
    std::ostringstream what;
    what << "io_timeout_s must be a finite number of seconds in [" << limits::kMinIoTimeoutSeconds
         << ", " << limits::kMaxIoTimeoutSeconds << "] (0 disables the deadline), got "
         << seconds;
    refuse(what.str());
  }
}

}  // namespace

EngineConfig validated(EngineConfig config) {
  EngineSettings& c = settings_of(config);
  if (c.n_read_threads == kMachineThreads || c.n_write_threads == kMachineThreads) {
    const ThreadCounts machine = machine_thread_counts(c.root_dir);
    if (c.n_read_threads == kMachineThreads) c.n_read_threads = machine.n_read_threads;
    if (c.n_write_threads == kMachineThreads) c.n_write_threads = machine.n_write_threads;
  }
  check_threads(c);
  if (c.fingerprint.size() > kFingerprintSize)
    refuse("fingerprint must be at most " + std::to_string(kFingerprintSize) + " bytes");
  check_staging(c);
  check_nice("worker_nice", c.worker_nice);
  check_nice("load_nice", c.load_nice);
  if (c.max_stores_in_flight_while_loading < limits::kMinStoresInFlightWhileLoading)
    refuse("max_stores_in_flight_while_loading must be at least " +
           std::to_string(limits::kMinStoresInFlightWhileLoading));
  check_file_mode(c.file_mode);
  check_io_timeout(c.io_timeout_s);
  if (c.root_dir.empty()) refuse("root_dir is required: every block path must lie below it");
  return config;
}

}  // namespace kvtier::detail
