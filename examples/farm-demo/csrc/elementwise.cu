// Element-wise kernels: y = x * scale + shift, and y = relu(a + b).
#include "dtypes.cuh"

#ifdef FARM_DEMO_HOST_PASS
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace farm_demo {

template <typename T>
__global__ void scale_shift_kernel(const T* __restrict__ x, T* __restrict__ y, float scale, float shift,
                                   long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x) {
    y[i] = from_float<T>(to_float(x[i]) * scale + shift);
  }
}

template <typename T>
__global__ void add_relu_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x) {
    float v = to_float(a[i]) + to_float(b[i]);
    y[i] = from_float<T>(v > 0.f ? v : 0.f);
  }
}

#define FARM_DEMO_INSTANTIATE(T)                                                                   \
  template __global__ void scale_shift_kernel<T>(const T*, T*, float, float, long long);          \
  template __global__ void add_relu_kernel<T>(const T*, const T*, T*, long long);
FARM_DEMO_INSTANTIATE(float)
FARM_DEMO_INSTANTIATE(__half)
FARM_DEMO_INSTANTIATE(__nv_bfloat16)

}  // namespace farm_demo

#ifdef FARM_DEMO_HOST_PASS
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

void check_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// torch dtype -> the kernels' device type.
template <typename F>
void dispatch(at::ScalarType dtype, const char* op, F&& f) {
  switch (dtype) {
    case at::kFloat: f(float{}); break;
    case at::kHalf: f(__half{}); break;
    case at::kBFloat16: f(__nv_bfloat16{}); break;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", dtype);
  }
}

}  // namespace

torch::Tensor scale_shift_cuda(torch::Tensor x, double scale, double shift) {
  check_cuda(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto y = torch::empty_like(x);
  const int64_t n = x.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  dispatch(x.scalar_type(), "scale_shift", [&](auto tag) {
    using T = decltype(tag);
    farm_demo::scale_shift_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), static_cast<float>(scale),
        static_cast<float>(shift), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

torch::Tensor add_relu_cuda(torch::Tensor a, torch::Tensor b) {
  check_cuda(a, "a");
  check_cuda(b, "b");
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "a and b must have the same dtype");
  const c10::cuda::CUDAGuard guard(a.device());
  auto y = torch::empty_like(a);
  const int64_t n = a.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  dispatch(a.scalar_type(), "add_relu", [&](auto tag) {
    using T = decltype(tag);
    farm_demo::add_relu_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()), static_cast<T*>(y.data_ptr()),
        n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
#endif  // FARM_DEMO_HOST_PASS
