#include <kvtier/thread_defaults.hpp>

#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <fstream>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {
namespace {

constexpr unsigned kMinPerDirection = 2;  // a second load can start while one is held up
constexpr unsigned kMaxPerDirection = 32;
// A psync worker holds one block operation; a 256 KiB-2 MiB operation becomes several
// device requests (split at max_sectors_kb), and both directions share the queue.
constexpr unsigned kRequestsPerWorker = 16;

}  // namespace

ThreadCounts default_thread_counts(unsigned cores, unsigned queue_depth) noexcept {
  const unsigned wanted = std::max(cores, queue_depth / kRequestsPerWorker);
  const unsigned n = std::clamp(wanted, kMinPerDirection, kMaxPerDirection);
  return {n, n};
}

unsigned usable_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

unsigned device_queue_depth(const std::string& path) noexcept {
  try {
    // The root may not exist yet (the engine creates it): its nearest existing ancestor is
    // on the file system it will be created on.
    std::string p = path.empty() ? std::string(".") : path;
    struct stat st;
    while (::stat(p.c_str(), &st) != 0) {
      if (p == "/" || p == ".") return 0;
      while (p.size() > 1 && p.back() == '/') p.pop_back();
      const auto slash = p.find_last_of('/');
      p = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
    }
    if (::major(st.st_dev) == 0) return 0;  // anonymous device: no request queue of its own
    const std::string dev = "/sys/dev/block/" + std::to_string(::major(st.st_dev)) + ":" +
                            std::to_string(::minor(st.st_dev));
    // A partition has no queue directory; its disk (the parent in sysfs) has.
    for (const char* queue : {"/queue/nr_requests", "/../queue/nr_requests"}) {
      std::ifstream in(dev + queue);
      unsigned depth = 0;
      if (in >> depth) return depth;
    }
    return 0;
  } catch (...) {  // std::string allocation: the default is then sized by cores alone
    return 0;
  }
}

ThreadCounts machine_thread_counts(const std::string& root_dir) noexcept {
  return default_thread_counts(usable_cores(), device_queue_depth(root_dir));
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
