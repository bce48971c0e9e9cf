#pragma once

#include <ctime>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kvtier/export.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// The suffix of every block file's name (`<key digest>.kvb`). A tmp file of a store in flight
/// is `<block name>.<host>.<pid>.<token>.<n>.tmp` (kTmpFilePattern). The one definition of what
/// a block is; Python reads it through kvtier._core.BLOCK_SUFFIX.
KVTIER_EXPORT extern const char kBlockSuffix[];

/// The state directory directly below a root (ledger, writer records, locks): never a block,
/// never walked by a survey. Python reads it through kvtier._core.STATE_DIR_NAME.
KVTIER_EXPORT extern const char kStateDirName[];

/// Usage of one namespace (the first directory below the root; "" for files directly in it).
struct NamespaceUsage {
  std::string name;
  std::int64_t blocks = 0;
  std::int64_t block_bytes = 0;
  std::int64_t tmp_files = 0;
  std::int64_t tmp_bytes = 0;
  /// Least and most recent use (st_mtime) of its blocks; valid when blocks > 0. A timespec,
  /// not nanoseconds: a file system may keep mtimes beyond what 64 bits of those can hold.
  timespec oldest{};
  timespec newest{};
};

/// A block the survey kept as an eviction candidate.
struct SurveyCandidate {
  std::uint32_t namespace_index = 0;  ///< into RootSurvey::namespaces()
  std::string path;                   ///< the root's path as given, then the names below it
  std::int64_t size = 0;
  timespec mtime{};
};

/// One walk over a root, for the capacity code (`kvtier gc`, `kvtier du`, a tier's evictor):
/// per namespace the blocks and tmp files and their bytes, and the least recently used blocks
/// that together cover `want_bytes` (at most `max_candidates` of them).
///
/// A block is a regular file whose name ends in kBlockSuffix; a block tmp file a regular file
/// whose name ends in ".tmp" and contains kBlockSuffix followed by a dot. Sizes are st_size,
/// last use is st_mtime. An entry with either kind of name is never descended into; every
/// other directory is. Symbolic links below the root are never followed (the root itself may
/// be reached through one), the state directory is skipped, and files or directories that
/// vanish during the walk are skipped, as are directories it may not read (EACCES). A missing
/// root is an empty one. Any other failure ends the walk and is reported by error().
///
/// The walk runs in steps (advance()), so that a caller can stop it between them; nothing in
/// it calls back. One thread at a time: a RootSurvey is not shared without a lock.
class KVTIER_EXPORT RootSurvey {
 public:
  RootSurvey(const std::string& root_dir, std::int64_t want_bytes, std::size_t max_candidates);
  ~RootSurvey();
  RootSurvey(RootSurvey&&) noexcept;
  RootSurvey& operator=(RootSurvey&&) noexcept;
  RootSurvey(const RootSurvey&) = delete;
  RootSurvey& operator=(const RootSurvey&) = delete;

  /// Walks on until `max_files` more block or block tmp files were counted, or the walk
  /// ended (true) or failed (true, and error() is set).
  bool advance(std::size_t max_files);

  /// Block and block tmp files counted so far.
  std::size_t files() const noexcept;

  /// 0, or the errno that ended the walk, with the call that failed and the entry's path.
  int error() const noexcept;
  const std::string& error_operation() const noexcept;
  const std::string& error_path() const noexcept;

  /// In the order they were first met.
  const std::vector<NamespaceUsage>& namespaces() const noexcept;

  /// The candidates, oldest first (ties by the paths' bytes); once the walk has ended. Moves
  /// them out.
  std::vector<SurveyCandidate> take_candidates();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
