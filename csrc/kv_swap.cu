// Batched KV-cache gather/scatter for swapping preempted requests (Autellix).
//
// vLLM keeps one paged KV tensor per attention layer. Viewed as
// (outer, num_blocks, inner) -- outer = 1 for block-first layouts, 2 for
// FlashAttention's (2, num_blocks, ...) -- a swap moves the same block ids of
// every layer. Instead of one cudaMemcpyAsync per block, per layer, per K/V
// (what a per-block swap issues), one kernel launch gathers all of them into
// one contiguous device buffer laid out (n, layers, outer, inner); the caller
// then moves that buffer to pinned host memory with a single copy. Scatter is
// the inverse. Semantics: autellix/engine/kv/swap.py (gather_blocks /
// scatter_blocks), which the tests compare bit for bit.
//
// This file is plain CUDA (no torch headers): the tensor checks and the Python
// binding live in kv_swap.cpp, so each half compiles with its own toolchain.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;

// One CUDA block per segment = (row i, layer l, outer o): segment_bytes
// contiguous bytes on both sides, copied with Vec-wide loads and stores.
template <typename Vec, bool kGather>
__global__ void move_segments(const int64_t* __restrict__ layer_ptrs,
                              const int64_t* __restrict__ block_ids,
                              char* __restrict__ rows, int64_t num_layers,
                              int64_t outer, int64_t num_blocks,
                              int64_t segment_bytes) {
  const int64_t seg = blockIdx.x;
  const int64_t o = seg % outer;
  const int64_t l = (seg / outer) % num_layers;
  const int64_t i = seg / (outer * num_layers);
  char* cache = reinterpret_cast<char*>(layer_ptrs[l]) +
                (o * num_blocks + block_ids[i]) * segment_bytes;
  char* row = rows + seg * segment_bytes;
  const Vec* src = reinterpret_cast<const Vec*>(kGather ? cache : row);
  Vec* dst = reinterpret_cast<Vec*>(kGather ? row : cache);
  const int64_t n = segment_bytes / static_cast<int64_t>(sizeof(Vec));
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    dst[k] = src[k];
  }
}

template <bool kGather>
cudaError_t launch(const int64_t* layer_ptrs, const int64_t* block_ids, char* rows,
                   int64_t segments, int64_t num_layers, int64_t outer,
                   int64_t num_blocks, int64_t segment_bytes, int64_t width,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(segments));
#define AUTELLIX_LAUNCH(VEC)                                                  \
  move_segments<VEC, kGather><<<grid, kThreads, 0, stream>>>(                 \
      layer_ptrs, block_ids, rows, num_layers, outer, num_blocks, segment_bytes)
  switch (width) {
    case 16: AUTELLIX_LAUNCH(int4); break;
    case 8: AUTELLIX_LAUNCH(int2); break;
    case 4: AUTELLIX_LAUNCH(int32_t); break;
    case 2: AUTELLIX_LAUNCH(int16_t); break;
    default: AUTELLIX_LAUNCH(char); break;
  }
#undef AUTELLIX_LAUNCH
  return cudaGetLastError();
}

}  // namespace

// Gather (gather != 0: cache -> rows) or scatter (rows -> cache) `n` blocks of
// every layer in one launch on `stream`. `base_alignment`: a power of two
// dividing every layer's base address. Returns a cudaError_t.
extern "C" int autellix_move_kv_blocks(int gather, const int64_t* layer_ptrs,
                                       const int64_t* block_ids, void* rows, int64_t n,
                                       int64_t num_layers, int64_t outer,
                                       int64_t num_blocks, int64_t segment_bytes,
                                       int64_t base_alignment, void* stream) {
  const int64_t segments = n * num_layers * outer;
  if (segments == 0) return cudaSuccess;
  if (segments >= (int64_t{1} << 31)) return cudaErrorInvalidConfiguration;
  // the widest access every segment start allows
  const uint64_t bits = static_cast<uint64_t>(segment_bytes) |
                        reinterpret_cast<uint64_t>(rows) |
                        static_cast<uint64_t>(base_alignment);
  int64_t width = 1;
  for (int64_t w : {16, 8, 4, 2}) {
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) {
      width = w;
      break;
    }
  }
  auto s = static_cast<cudaStream_t>(stream);
  auto* r = static_cast<char*>(rows);
  return gather ? launch<true>(layer_ptrs, block_ids, r, segments, num_layers, outer,
                               num_blocks, segment_bytes, width, s)
                : launch<false>(layer_ptrs, block_ids, r, segments, num_layers, outer,
                                num_blocks, segment_bytes, width, s);
}

extern "C" const char* autellix_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

// ---- baselines for experiments/kv_swap_cost.py -------------------------------------------------
// The same move without the kernel, straight between the paged cache and the
// host rows: one cudaMemcpyAsync per segment (block x layer x K/V: what a
// per-block swap issues), or all segments in one cudaMemcpyBatchAsync call
// (what vLLM 0.32's offloading connector submits: one driver call, still one
// DMA descriptor per segment). layer_ptrs and block_ids are host arrays here.
namespace {

void segment_addresses(int gather, const int64_t* layer_ptrs, const int64_t* block_ids,
                       char* rows, int64_t n, int64_t num_layers, int64_t outer,
                       int64_t num_blocks, int64_t segment_bytes, void** dsts,
                       const void** srcs) {
  int64_t seg = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t l = 0; l < num_layers; ++l) {
      for (int64_t o = 0; o < outer; ++o, ++seg) {
        char* cache = reinterpret_cast<char*>(layer_ptrs[l]) +
                      (o * num_blocks + block_ids[i]) * segment_bytes;
        char* row = rows + seg * segment_bytes;
        dsts[seg] = gather ? row : cache;
        srcs[seg] = gather ? cache : row;
      }
    }
  }
}

}  // namespace

extern "C" int autellix_copy_kv_segments(int gather, int batch_api, const int64_t* layer_ptrs,
                                         const int64_t* block_ids, void* rows, int64_t n,
                                         int64_t num_layers, int64_t outer,
                                         int64_t num_blocks, int64_t segment_bytes,
                                         void* stream) {
  const int64_t segments = n * num_layers * outer;
  if (segments == 0) return cudaSuccess;
  void** dsts = new void*[segments];
  const void** srcs = new const void*[segments];
  segment_addresses(gather, layer_ptrs, block_ids, static_cast<char*>(rows), n, num_layers,
                    outer, num_blocks, segment_bytes, dsts, srcs);
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t error = cudaSuccess;
  if (!batch_api) {
    for (int64_t k = 0; k < segments && error == cudaSuccess; ++k) {
      error = cudaMemcpyAsync(dsts[k], srcs[k], segment_bytes, cudaMemcpyDefault, s);
    }
  } else {
#if CUDART_VERSION >= 12080
    size_t* sizes = new size_t[segments];
    for (int64_t k = 0; k < segments; ++k) sizes[k] = static_cast<size_t>(segment_bytes);
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    error = cudaMemcpyBatchAsync(dsts, srcs, sizes, segments, &attr, &attr_index, 1, s);
#else
    size_t fail_index = 0;
    error = cudaMemcpyBatchAsync(dsts, const_cast<void**>(srcs), sizes, segments, &attr,
                                 &attr_index, 1, &fail_index, s);
#endif
    delete[] sizes;
#else
    error = cudaErrorNotSupported;
#endif
  }
  // the driver has captured the arguments; the arrays can go
  delete[] dsts;
  delete[] srcs;
  return error;
}
