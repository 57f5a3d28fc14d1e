// Python bindings of the demo kernels (module farm_demo._C).
#include <torch/extension.h>

torch::Tensor scale_shift_cuda(torch::Tensor x, double scale, double shift);
torch::Tensor add_relu_cuda(torch::Tensor a, torch::Tensor b);
torch::Tensor row_sum_cuda(torch::Tensor x);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "farm-demo: a small CUDA extension built by the cuda-wheel farm";
  m.def("scale_shift", &scale_shift_cuda, "y = x * scale + shift", py::arg("x"), py::arg("scale"),
        py::arg("shift"));
  m.def("add_relu", &add_relu_cuda, "y = relu(a + b)", py::arg("a"), py::arg("b"));
  m.def("row_sum", &row_sum_cuda, "sum over the last dim of a 2-D tensor (float32 result)", py::arg("x"));
}
