#pragma once

#include <cstddef>
#include <string>

// kvtier never links against CUDA: the runtime library the process already has (for example
// the one torch loaded) is found with dlopen at first use. These declarations mirror the
// official ones; cuda_api_check.cpp verifies them against the CUDA headers when a toolkit is
// present at build time.
struct CUstream_st;
struct CUevent_st;

namespace kvtier::detail::cuda {

using Error = int;  // cudaError_t (an enum of int size in the official headers)
using Stream = CUstream_st*;
using Event = CUevent_st*;
using MemcpyKind = int;  // enum cudaMemcpyKind

inline constexpr Error kSuccess = 0;
inline constexpr MemcpyKind kDeviceToHost = 2;
inline constexpr MemcpyKind kHostToDevice = 1;
inline constexpr unsigned kStreamNonBlocking = 0x01;
inline constexpr unsigned kEventDisableTiming = 0x02;
inline constexpr unsigned kHostRegisterPortable = 0x01;

/// Layout-compatible with struct cudaMemcpyAttributes (CUDA 12.8+).
struct MemcpyAttributes {
  int src_access_order;  // cudaMemcpySrcAccessOrderStream = 1
  int src_loc_type;
  int src_loc_id;
  int dst_loc_type;
  int dst_loc_id;
  unsigned flags;
};
inline constexpr int kSrcAccessOrderStream = 1;

// The functions kvtier requires: X(name, parameter list). The batched copy, which exists from
// CUDA 12.8 on (with an extra failIdx argument before 13.0), is looked up separately.
#define KVTIER_CUDA_REQUIRED_FUNCTIONS(X)                              \
  X(cudaRuntimeGetVersion, (int*))                                     \
  X(cudaGetDeviceCount, (int*))                                        \
  X(cudaGetDevice, (int*))                                             \
  X(cudaSetDevice, (int))                                              \
  X(cudaDeviceGetPCIBusId, (char*, int, int))                          \
  X(cudaStreamCreateWithFlags, (Stream*, unsigned int))                \
  X(cudaStreamDestroy, (Stream))                                       \
  X(cudaStreamSynchronize, (Stream))                                   \
  X(cudaStreamWaitEvent, (Stream, Event, unsigned int))                \
  X(cudaEventCreateWithFlags, (Event*, unsigned int))                  \
  X(cudaEventRecord, (Event, Stream))                                  \
  X(cudaEventDestroy, (Event))                                         \
  X(cudaMemcpyAsync, (void*, const void*, size_t, MemcpyKind, Stream)) \
  X(cudaHostRegister, (void*, size_t, unsigned int))                   \
  X(cudaHostUnregister, (void*))                                       \
  X(cudaGetLastError, ())

using BatchCopy13 = Error (*)(void* const*, const void* const*, const size_t*, size_t,
                              MemcpyAttributes*, size_t*, size_t, Stream);
using BatchCopy12 = Error (*)(void* const*, const void* const*, const size_t*, size_t,
                              MemcpyAttributes*, size_t*, size_t, size_t*, Stream);

/// The loaded runtime's entry points.
struct Api {
#define KVTIER_CUDA_MEMBER(name, params) Error(*name) params = nullptr;
  KVTIER_CUDA_REQUIRED_FUNCTIONS(KVTIER_CUDA_MEMBER)
#undef KVTIER_CUDA_MEMBER
  const char* (*cudaGetErrorName)(Error) = nullptr;
  const char* (*cudaGetErrorString)(Error) = nullptr;
  BatchCopy13 batch_copy_13 = nullptr;  // CUDA >= 13.0
  BatchCopy12 batch_copy_12 = nullptr;  // 12.8 <= CUDA < 13.0
  int runtime_version = 0;
  int device_count = 0;
  std::string library;  ///< the file or soname it came from
};

/// The CUDA runtime, loaded once per process; nullptr when there is none or no GPU.
/// Search order: $KVTIER_CUDART (a path), a libcudart already loaded in the process, then the
/// standard sonames. Thread-safe.
const Api* runtime() noexcept;

/// Why runtime() is nullptr (empty when it is not).
const std::string& unavailable_reason() noexcept;

/// "cudaErrorInvalidValue: invalid argument" for an error code.
std::string describe(const Api& api, Error error);

/// Makes `device` the calling thread's current device until destroyed, then restores the
/// device that was current before. The runtime keeps the current device per thread, and
/// events, streams and the legacy default stream belong to the device current when they are
/// made or named: a caller thread whose current device is another GPU must not see kvtier's
/// choice leak out. Never throws; error() says whether the switch failed.
class DeviceScope {
 public:
  DeviceScope(const Api& api, int device) noexcept;
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  Error error() const noexcept { return error_; }

 private:
  const Api& api_;
  int previous_ = -1;  // -1: nothing to restore
  Error error_ = kSuccess;
};

/// Creates an event on `device` and records it on `stream` (nullptr: the legacy default
/// stream of `device`), leaving the calling thread's current device as it was. Returns
/// kSuccess with `out` set, or the CUDA error with `out` null (nothing to destroy).
Error record_event_on(const Api& api, int device, Stream stream, Event& out) noexcept;

}  // namespace kvtier::detail::cuda
