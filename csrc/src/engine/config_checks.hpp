#pragma once

#include <kvtier/config.hpp>

namespace kvtier::detail {

/// The configuration an Engine runs with: thread counts left at kMachineThreads sized by the
/// machine (machine_thread_counts of root_dir), then every field checked against
/// kvtier::limits. Throws std::invalid_argument naming the field and what it must be, before
/// anything is allocated.
EngineConfig validated(EngineConfig config);

}  // namespace kvtier::detail
