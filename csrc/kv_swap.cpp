// Python binding of the batched KV gather/scatter (kv_swap.cu): tensor checks
// here, the kernel there. Needs only torch's CPU-side headers.
#include <torch/extension.h>

#include <cstdint>

extern "C" int autellix_move_kv_blocks(int gather, const int64_t* layer_ptrs,
                                       const int64_t* block_ids, void* rows, int64_t n,
                                       int64_t num_layers, int64_t outer,
                                       int64_t num_blocks, int64_t segment_bytes,
                                       int64_t base_alignment, void* stream);
extern "C" const char* autellix_cuda_error_string(int error);
extern "C" int autellix_copy_kv_segments(int gather, int batch_api, const int64_t* layer_ptrs,
                                         const int64_t* block_ids, void* rows, int64_t n,
                                         int64_t num_layers, int64_t outer,
                                         int64_t num_blocks, int64_t segment_bytes,
                                         void* stream);

namespace {

void move(bool gather, const torch::Tensor& layer_ptrs, const torch::Tensor& block_ids,
          const torch::Tensor& rows, int64_t num_blocks, int64_t base_alignment,
          int64_t stream) {
  TORCH_CHECK(layer_ptrs.is_cuda() && layer_ptrs.scalar_type() == torch::kInt64 &&
                  layer_ptrs.dim() == 1 && layer_ptrs.is_contiguous(),
              "layer_ptrs: a 1-D int64 CUDA tensor of per-layer base addresses");
  TORCH_CHECK(block_ids.is_cuda() && block_ids.scalar_type() == torch::kInt64 &&
                  block_ids.dim() == 1 && block_ids.is_contiguous(),
              "block_ids: a 1-D int64 CUDA tensor");
  TORCH_CHECK(rows.is_cuda() && rows.is_contiguous() && rows.dim() == 4,
              "rows: a contiguous CUDA tensor (n, layers, outer, inner)");
  TORCH_CHECK(rows.device() == block_ids.device() && rows.device() == layer_ptrs.device(),
              "rows, block_ids and layer_ptrs must be on one device");
  TORCH_CHECK(rows.size(0) == block_ids.size(0), "rows and block_ids differ in length");
  TORCH_CHECK(rows.size(1) == layer_ptrs.size(0), "rows and layer_ptrs differ in layers");
  TORCH_CHECK(num_blocks > 0, "num_blocks must be positive");
  TORCH_CHECK(base_alignment > 0 && (base_alignment & (base_alignment - 1)) == 0,
              "base_alignment must be a power of two");
  const int error = autellix_move_kv_blocks(
      gather ? 1 : 0, layer_ptrs.data_ptr<int64_t>(), block_ids.data_ptr<int64_t>(),
      rows.data_ptr(), rows.size(0), rows.size(1), rows.size(2), num_blocks,
      rows.size(3) * static_cast<int64_t>(rows.element_size()), base_alignment,
      reinterpret_cast<void*>(stream));
  TORCH_CHECK(error == 0, "KV block ", gather ? "gather" : "scatter",
              " failed: ", autellix_cuda_error_string(error));
}

// Benchmark baselines: per-segment cudaMemcpyAsync, or one cudaMemcpyBatchAsync.
void copy_segments(bool gather, bool batch_api, const torch::Tensor& layer_ptrs,
                   const torch::Tensor& block_ids, const torch::Tensor& rows, int64_t num_blocks,
                   int64_t stream) {
  TORCH_CHECK(!layer_ptrs.is_cuda() && layer_ptrs.scalar_type() == torch::kInt64 &&
                  layer_ptrs.is_contiguous(),
              "layer_ptrs: a host int64 tensor");
  TORCH_CHECK(!block_ids.is_cuda() && block_ids.scalar_type() == torch::kInt64 &&
                  block_ids.is_contiguous(),
              "block_ids: a host int64 tensor");
  TORCH_CHECK(rows.is_pinned() && rows.is_contiguous() && rows.dim() == 4,
              "rows: pinned host rows (n, layers, outer, inner)");
  TORCH_CHECK(rows.size(0) == block_ids.numel() && rows.size(1) == layer_ptrs.numel(),
              "rows do not match block_ids x layers");
  const int error = autellix_copy_kv_segments(
      gather ? 1 : 0, batch_api ? 1 : 0, layer_ptrs.data_ptr<int64_t>(),
      block_ids.data_ptr<int64_t>(), rows.data_ptr(), rows.size(0), rows.size(1), rows.size(2),
      num_blocks, rows.size(3) * static_cast<int64_t>(rows.element_size()),
      reinterpret_cast<void*>(stream));
  TORCH_CHECK(error == 0, "segment copies failed: ", autellix_cuda_error_string(error));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Batched KV-cache block gather/scatter for swapping (Autellix)";
  m.def(
      "gather_kv_blocks",
      [](const torch::Tensor& layer_ptrs, const torch::Tensor& block_ids, torch::Tensor& rows,
         int64_t num_blocks, int64_t base_alignment, int64_t stream) {
        move(true, layer_ptrs, block_ids, rows, num_blocks, base_alignment, stream);
      },
      "Gather blocks block_ids of every layer into rows (n, layers, outer, inner), one launch",
      pybind11::arg("layer_ptrs"), pybind11::arg("block_ids"), pybind11::arg("rows"),
      pybind11::arg("num_blocks"), pybind11::arg("base_alignment"), pybind11::arg("stream"));
  m.def(
      "scatter_kv_blocks",
      [](const torch::Tensor& layer_ptrs, const torch::Tensor& block_ids,
         const torch::Tensor& rows, int64_t num_blocks, int64_t base_alignment,
         int64_t stream) {
        move(false, layer_ptrs, block_ids, rows, num_blocks, base_alignment, stream);
      },
      "Scatter rows (n, layers, outer, inner) into blocks block_ids of every layer, one launch",
      pybind11::arg("layer_ptrs"), pybind11::arg("block_ids"), pybind11::arg("rows"),
      pybind11::arg("num_blocks"), pybind11::arg("base_alignment"), pybind11::arg("stream"));
  m.def("copy_kv_segments", &copy_segments,
        "Benchmark baseline: the same move as cudaMemcpyAsync per segment (batch_api=False) "
        "or one cudaMemcpyBatchAsync (batch_api=True), cache <-> pinned host rows",
        pybind11::arg("gather"), pybind11::arg("batch_api"), pybind11::arg("layer_ptrs"),
        pybind11::arg("block_ids"), pybind11::arg("rows"), pybind11::arg("num_blocks"),
        pybind11::arg("stream"));
}
