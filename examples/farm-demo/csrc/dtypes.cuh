// Device-side element types shared by the demo kernels: float, __half, __nv_bfloat16.
// Conversions are explicit because torch builds with __CUDA_NO_HALF_CONVERSIONS__.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace farm_demo {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

}  // namespace farm_demo

// torch's headers are needed by the host code only. Keeping them out of the device passes
// (nvcc runs one per arch, 6 here) cuts the demo's compile from ~13 to ~2 CPU-minutes: the
// tests and the bench build it many times. Kernels are explicitly instantiated outside the
// guard so both passes see the same __global__ functions, as nvcc requires.
#if !defined(__CUDA_ARCH__)
#define FARM_DEMO_HOST_PASS 1
#endif
