// Row reduction: out[r] = sum(x[r, :]) for a 2-D tensor, one block per row (float32 result).
#include "dtypes.cuh"

#ifdef FARM_DEMO_HOST_PASS
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace farm_demo {

constexpr int kReduceThreads = 256;

template <typename T>
__global__ void row_sum_kernel(const T* __restrict__ x, float* __restrict__ out, long long cols) {
  __shared__ float partial[kReduceThreads];
  const T* row = x + blockIdx.x * cols;
  float acc = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    acc += to_float(row[c]);
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

template __global__ void row_sum_kernel<float>(const float*, float*, long long);
template __global__ void row_sum_kernel<__half>(const __half*, float*, long long);
template __global__ void row_sum_kernel<__nv_bfloat16>(const __nv_bfloat16*, float*, long long);

}  // namespace farm_demo

#ifdef FARM_DEMO_HOST_PASS
torch::Tensor row_sum_cuda(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, got ", x.dim(), "-D");
  auto xc = x.contiguous();
  const c10::cuda::CUDAGuard guard(xc.device());
  const int64_t rows = xc.size(0), cols = xc.size(1);
  auto out = torch::empty({rows}, xc.options().dtype(torch::kFloat32));
  if (rows == 0) return out;
  auto stream = at::cuda::getCurrentCUDAStream();
  const unsigned grid = static_cast<unsigned>(rows);
  switch (xc.scalar_type()) {
    case at::kFloat:
      farm_demo::row_sum_kernel<float><<<grid, farm_demo::kReduceThreads, 0, stream>>>(
          static_cast<const float*>(xc.data_ptr()), out.data_ptr<float>(), cols);
      break;
    case at::kHalf:
      farm_demo::row_sum_kernel<__half><<<grid, farm_demo::kReduceThreads, 0, stream>>>(
          static_cast<const __half*>(xc.data_ptr()), out.data_ptr<float>(), cols);
      break;
    case at::kBFloat16:
      farm_demo::row_sum_kernel<__nv_bfloat16><<<grid, farm_demo::kReduceThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(xc.data_ptr()), out.data_ptr<float>(), cols);
      break;
    default:
      TORCH_CHECK(false, "row_sum: unsupported dtype ", xc.scalar_type());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
#endif  // FARM_DEMO_HOST_PASS
