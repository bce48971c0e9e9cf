#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>

#include "engine/job.hpp"
#include "engine/parked_loads.hpp"

namespace kvtier::detail {

/// Read-after-write: every path with a store block submitted to the engine and not finished,
/// and the load blocks of that path parked until none is. A load of such a path waits
/// (without occupying a worker) and then reads what the stores left. Paths are compared as
/// strings. No locking of its own: the scheduler's mutex guards it.
class PendingStores {
 public:
  bool empty() const noexcept { return paths_.empty(); }
  /// Whether a store of `path` is pending.
  bool pending(const std::string& path) const { return paths_.count(path) > 0; }
  /// Load blocks parked now.
  std::size_t parked() const noexcept { return parked_; }

  /// Registers the store blocks of `job` as pending for their paths. All or nothing: throws
  /// std::bad_alloc with nothing registered.
  void add(const Job& job);

  /// One store block of `path` finished (or was cancelled or rolled back). When it was the
  /// last pending one, the loads parked on the path move to the end of `ready`; returns how
  /// many did.
  std::size_t release(const std::string& path, ParkedList& ready) noexcept;

  /// Parks load block `link` behind the pending stores of `path`; false (nothing parked) when
  /// no store of it is pending.
  bool park(const std::string& path, ParkedLoad* link) noexcept;

  /// Moves every parked load to the end of `ready` (at shutdown); the stores stay pending.
  void unpark_all(ParkedList& ready) noexcept;

  /// Moves the loads parked on paths beneath `directory` (path_beneath) to the end of `out`;
  /// the stores stay pending.
  void unpark_beneath(std::string_view directory, ParkedList& out) noexcept;

 private:
  struct Path {
    std::size_t stores = 0;
    ParkedList parked;
  };
  std::unordered_map<std::string, Path> paths_;
  std::size_t parked_ = 0;
};

}  // namespace kvtier::detail
