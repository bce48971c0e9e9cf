#include <kvtier/config.hpp>

#include <stdexcept>

namespace kvtier {

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

}  // namespace kvtier
