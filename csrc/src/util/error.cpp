// Out-of-line destructors: each error type's vtable and type_info live in the core library,
// once, so a catch in another shared object (the Python module, a C++ program) matches it.
#include <kvtier/error.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

SystemError::~SystemError() = default;
IoUringRefusedError::~IoUringRefusedError() = default;
EngineShutDownError::~EngineShutDownError() = default;
ForkedProcessError::~ForkedProcessError() = default;

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
