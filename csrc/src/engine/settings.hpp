#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include <kvtier/config.hpp>

namespace kvtier::detail {

/// What an EngineConfig holds, with every default: the one definition of the defaults
/// (EngineConfig's getters, and through them the Python binding's ENGINE_DEFAULTS, read them
/// from a default-constructed one). Inside the core, code reads these fields directly.
/// EngineConfig's documentation says what each one means.
struct EngineSettings {
  std::string root_dir;
  unsigned n_read_threads = kMachineThreads;
  unsigned n_write_threads = kMachineThreads;
  ODirectMode o_direct = ODirectMode::kAuto;
  Checksum checksum = Checksum::kCrc32c;
  IoEngine io_engine = IoEngine::kAuto;
  Durability durability = Durability::kNone;
  mode_t file_mode = 0600;
  std::string fingerprint;
  unsigned max_stores_in_flight_while_loading = 1;
  unsigned store_cap_linger_ms = 100;
  std::size_t staging_bytes_total = std::size_t{64} << 20;
  std::size_t staging_buffer_bytes = std::size_t{2} << 20;
  bool use_cuda = false;
  int cuda_device = -1;
  int worker_nice = 19;
  int load_nice = 0;
  bool numa_bind = false;
  bool completion_eventfd = false;
  double io_timeout_s = 10.0;
};

/// The core's way into an EngineConfig's settings.
struct SettingsAccess {
  static const EngineSettings& of(const EngineConfig& config) noexcept { return *config.settings_; }
  static EngineSettings& of(EngineConfig& config) noexcept { return *config.settings_; }
};

/// The settings of `config`.
inline const EngineSettings& settings_of(const EngineConfig& config) noexcept {
  return SettingsAccess::of(config);
}
inline EngineSettings& settings_of(EngineConfig& config) noexcept {
  return SettingsAccess::of(config);
}

}  // namespace kvtier::detail
