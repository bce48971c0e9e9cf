#include <kvtier/config.hpp>

#include <stdexcept>
#include <utility>

#include "engine/settings.hpp"

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

// ---- EngineConfig: getters and setters over detail::EngineSettings ------------------------

EngineConfig::EngineConfig() : settings_(std::make_unique<detail::EngineSettings>()) {}
EngineConfig::~EngineConfig() = default;
EngineConfig::EngineConfig(const EngineConfig& other)
    : settings_(std::make_unique<detail::EngineSettings>(*other.settings_)) {}
EngineConfig& EngineConfig::operator=(const EngineConfig& other) {
  if (this != &other) *settings_ = *other.settings_;
  return *this;
}

// A getter and a chaining setter per setting.
#define KVTIER_SETTING(type, getter_type, name)        \
  getter_type EngineConfig::name() const noexcept {    \
    return settings_->name;                            \
  }                                                    \
  EngineConfig& EngineConfig::set_##name(type value) { \
    settings_->name = std::move(value);                \
    return *this;                                      \
  }
KVTIER_SETTING(std::string, const std::string&, root_dir)
KVTIER_SETTING(unsigned, unsigned, n_read_threads)
KVTIER_SETTING(unsigned, unsigned, n_write_threads)
KVTIER_SETTING(ODirectMode, ODirectMode, o_direct)
KVTIER_SETTING(Checksum, Checksum, checksum)
KVTIER_SETTING(IoEngine, IoEngine, io_engine)
KVTIER_SETTING(Durability, Durability, durability)
KVTIER_SETTING(mode_t, mode_t, file_mode)
KVTIER_SETTING(std::string, const std::string&, fingerprint)
KVTIER_SETTING(unsigned, unsigned, max_stores_in_flight_while_loading)
KVTIER_SETTING(unsigned, unsigned, store_cap_linger_ms)
KVTIER_SETTING(std::size_t, std::size_t, staging_bytes_total)
KVTIER_SETTING(std::size_t, std::size_t, staging_buffer_bytes)
KVTIER_SETTING(bool, bool, use_cuda)
KVTIER_SETTING(int, int, cuda_device)
KVTIER_SETTING(int, int, worker_nice)
KVTIER_SETTING(int, int, load_nice)
KVTIER_SETTING(bool, bool, numa_bind)
KVTIER_SETTING(bool, bool, completion_eventfd)
KVTIER_SETTING(double, double, io_timeout_s)
#undef KVTIER_SETTING

// ---- option spellings ----------------------------------------------------------------------

namespace {
[[noreturn]] void bad_choice(const char* option, const std::string& text, const char* choices) {
  throw std::invalid_argument("Invalid value '" + text + "' for option '" + option +
                              "'. Valid values: " + choices);
}
}  // namespace

ODirectMode parse_o_direct(const std::string& text) {
  if (text == "auto") return ODirectMode::kAuto;
  if (text == "true" || text == "on" || text == "1") return ODirectMode::kOn;
  if (text == "false" || text == "off" || text == "0") return ODirectMode::kOff;
  bad_choice("o_direct", text, "['auto', 'true', 'false']");
}

Checksum parse_checksum(const std::string& text) {
  if (text == "crc32c") return Checksum::kCrc32c;
  if (text == "none") return Checksum::kNone;
  bad_choice("checksum", text, "['crc32c', 'none']");
}

Durability parse_durability(const std::string& text) {
  if (text == "none") return Durability::kNone;
  if (text == "data") return Durability::kData;
  if (text == "full") return Durability::kFull;
  bad_choice("durability", text, "['none', 'data', 'full']");
}

IoEngine parse_io_engine(const std::string& text) {
  if (text == "auto") return IoEngine::kAuto;
  if (text == "io_uring") return IoEngine::kIoUring;
  if (text == "psync") return IoEngine::kPsync;
  bad_choice("io_engine", text, "['auto', 'io_uring', 'psync']");
}

const char* to_string(ODirectMode mode) noexcept {
  switch (mode) {
    case ODirectMode::kAuto:
      return "auto";
    case ODirectMode::kOn:
      return "true";
    case ODirectMode::kOff:
      return "false";
  }
  return "?";
}

const char* to_string(Checksum checksum) noexcept {
  return checksum == Checksum::kCrc32c ? "crc32c" : "none";
}

const char* to_string(Durability durability) noexcept {
  switch (durability) {
    case Durability::kNone:
      return "none";
    case Durability::kData:
      return "data";
    case Durability::kFull:
      return "full";
  }
  return "?";
}

const char* to_string(IoEngine engine) noexcept {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kIoUring:
      return "io_uring";
    case IoEngine::kPsync:
      return "psync";
  }
  return "?";
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
