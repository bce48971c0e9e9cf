#pragma once

#include <vector>

#include "device/cuda_runtime.hpp"

namespace kvtier::detail {

/// The CPUs of the NUMA node GPU `device` is attached to, read from sysfs (its PCI bus id's
/// numa_node, then that node's cpulist); empty, with `node` -1, where the system does not say.
std::vector<int> gpu_numa_cpus(const cuda::Api& api, int device, int& node);

}  // namespace kvtier::detail
