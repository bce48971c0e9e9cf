#include "engine/pending_stores.hpp"

namespace kvtier::detail {

void PendingStores::add(const Job& job) {
  std::size_t added = 0;
  try {
    for (const BlockOp& op : job.blocks) {
      ++paths_[op.path].stores;
      ++added;
    }
  } catch (...) {
    ParkedList none;  // nothing can be parked on a store that was never visible
    for (std::size_t i = 0; i < added; ++i) release(job.blocks[i].path, none);
    throw;
  }
}

std::size_t PendingStores::release(const std::string& path, ParkedList& ready) noexcept {
  const auto it = paths_.find(path);
  if (it == paths_.end() || --it->second.stores > 0) return 0;
  const std::size_t woken = it->second.parked.size;
  ready.append(it->second.parked);
  parked_ -= woken;
  paths_.erase(it);
  return woken;
}

bool PendingStores::park(const std::string& path, ParkedLoad* link) noexcept {
  const auto it = paths_.find(path);
  if (it == paths_.end()) return false;
  it->second.parked.push(link);
  ++parked_;
  return true;
}

void PendingStores::unpark_all(ParkedList& ready) noexcept {
  for (auto& [path, pending] : paths_) {
    parked_ -= pending.parked.size;
    ready.append(pending.parked);
  }
}

void PendingStores::unpark_beneath(std::string_view directory, ParkedList& out) noexcept {
  for (auto& [path, pending] : paths_) {
    if (!path_beneath(path, directory)) continue;
    parked_ -= pending.parked.size;
    out.append(pending.parked);
  }
}

}  // namespace kvtier::detail
