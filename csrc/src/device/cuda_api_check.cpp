// Compile-time check, built only where a CUDA toolkit's headers exist: kvtier's own
// declarations of the runtime functions (cuda_runtime.hpp) must match the official ones,
// because kvtier calls them through dlsym'd pointers where the compiler cannot check.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <type_traits>

#include "device/cuda_runtime.hpp"

namespace kvtier::detail::cuda_check {

// The official types stand in for kvtier's aliases; everything else must be identical.
using Error = cudaError_t;
using Stream = cudaStream_t;
using Event = cudaEvent_t;
using MemcpyKind = cudaMemcpyKind;

static_assert(std::is_same_v<cuda::Stream, cudaStream_t>);
static_assert(std::is_same_v<cuda::Event, cudaEvent_t>);
static_assert(sizeof(cuda::Error) == sizeof(cudaError_t));
static_assert(sizeof(cuda::MemcpyKind) == sizeof(cudaMemcpyKind));
static_assert(cuda::kSuccess == cudaSuccess);
static_assert(cuda::kDeviceToHost == cudaMemcpyDeviceToHost);
static_assert(cuda::kHostToDevice == cudaMemcpyHostToDevice);
static_assert(cuda::kStreamNonBlocking == cudaStreamNonBlocking);
static_assert(cuda::kEventDisableTiming == cudaEventDisableTiming);
static_assert(cuda::kHostRegisterPortable == cudaHostRegisterPortable);

#define KVTIER_CUDA_CHECK(name, params)                             \
  static_assert(std::is_same_v<decltype(&::name), Error(*) params>, \
                "kvtier's declaration of " #name " differs from the CUDA headers");
KVTIER_CUDA_REQUIRED_FUNCTIONS(KVTIER_CUDA_CHECK)
#undef KVTIER_CUDA_CHECK

static_assert(std::is_same_v<decltype(&::cudaGetErrorName), const char* (*)(cudaError_t)>);
static_assert(std::is_same_v<decltype(&::cudaGetErrorString), const char* (*)(cudaError_t)>);

#if CUDART_VERSION >= 13000
static_assert(
    std::is_same_v<decltype(&::cudaMemcpyBatchAsync),
                   cudaError_t (*)(void* const*, const void* const*, const size_t*, size_t,
                                   cudaMemcpyAttributes*, size_t*, size_t, cudaStream_t)>);
#elif CUDART_VERSION >= 12080
static_assert(
    std::is_same_v<decltype(&::cudaMemcpyBatchAsync),
                   cudaError_t (*)(void* const*, const void* const*, const size_t*, size_t,
                                   cudaMemcpyAttributes*, size_t*, size_t, size_t*, cudaStream_t)>);
#endif
#if CUDART_VERSION >= 12080
static_assert(sizeof(cuda::MemcpyAttributes) == sizeof(cudaMemcpyAttributes));
static_assert(offsetof(cudaMemcpyAttributes, srcLocHint) ==
              offsetof(cuda::MemcpyAttributes, src_loc_type));
static_assert(offsetof(cudaMemcpyAttributes, dstLocHint) ==
              offsetof(cuda::MemcpyAttributes, dst_loc_type));
static_assert(offsetof(cudaMemcpyAttributes, flags) == offsetof(cuda::MemcpyAttributes, flags));
static_assert(cuda::kSrcAccessOrderStream == cudaMemcpySrcAccessOrderStream);
#endif

}  // namespace kvtier::detail::cuda_check
