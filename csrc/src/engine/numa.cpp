#include "engine/numa.hpp"

#include <cctype>
#include <exception>
#include <fstream>
#include <string>

namespace kvtier::detail {
namespace {

// Appends the CPUs of a sysfs cpulist ("0-15,32-47"); false when it does not parse.
bool parse_cpu_list(const std::string& text, std::vector<int>& cpus) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string range = text.substr(pos, end - pos);
    const auto dash = range.find('-');
    try {
      const int lo = std::stoi(range.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(range.substr(dash + 1));
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      return false;
    }
    pos = end + 1;
  }
  return true;
}

}  // namespace

std::vector<int> gpu_numa_cpus(const cuda::Api& api, int device, int& node) {
  node = -1;
  char bus_id[64] = {};
  if (api.cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cuda::kSuccess) {
    api.cudaGetLastError();
    return {};
  }
  std::string id(bus_id);
  for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::ifstream numa("/sys/bus/pci/devices/" + id + "/numa_node");
  if (!(numa >> node) || node < 0) {
    node = -1;
    return {};
  }
  std::ifstream list("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::string text;
  std::getline(list, text);
  std::vector<int> cpus;
  if (!parse_cpu_list(text, cpus) || cpus.empty()) {
    node = -1;
    return {};
  }
  return cpus;
}

}  // namespace kvtier::detail
