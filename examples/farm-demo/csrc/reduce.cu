// Row reduction: out[r] = sum(x[r, :]) for a 2-D tensor, one block per row.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

constexpr int kThreads = 256;

template <typename scalar_t>
__global__ void row_sum_kernel(const scalar_t* __restrict__ x, float* __restrict__ out, int64_t cols) {
  __shared__ float partial[kThreads];
  const scalar_t* row = x + blockIdx.x * cols;
  float acc = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    acc += static_cast<float>(row[c]);
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

}  // namespace

torch::Tensor row_sum_cuda(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, got ", x.dim(), "-D");
  auto xc = x.contiguous();
  const c10::cuda::CUDAGuard guard(xc.device());
  const int64_t rows = xc.size(0), cols = xc.size(1);
  auto out = torch::empty({rows}, xc.options().dtype(torch::kFloat32));
  if (rows == 0) return out;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, xc.scalar_type(),
                                  "row_sum_cuda", [&] {
    row_sum_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        xc.data_ptr<scalar_t>(), out.data_ptr<float>(), cols);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
