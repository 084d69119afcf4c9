// CUDA kernels and the few runtime helpers of mooncake.ep's GPU path, exported as a C ABI for ctypes
// (ep/cuda/device.py). No torch or Python dependency: callers pass raw device pointers and the stream to run on.
//
// Row formats (identical to the CPU path in ep/buffer.py, so both paths exchange the same bytes):
//   bf16 row: hidden bf16 values (2 * hidden bytes).
//   fp8 row:  hidden e4m3 bytes, then hidden / 128 fp32 scales (scale = max(amax, 1e-8) / 448 per 128 channels).
// A packed row slot is always 2 * hidden bytes; fp8 rows use its first hidden * (1 + 4 / 128) bytes.
//
// Errors: every function returns a cudaError_t value (0 = success); mc_ep_error_string names it.
// Threading: functions are thread-safe as the CUDA runtime is; kernels run asynchronously on `stream`.

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#define MC_EP_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kBlock = 128;        // channels per fp8 scale
constexpr float kFp8Max = 448.0f;  // largest finite e4m3 value
constexpr int kThreads = 256;

__device__ __forceinline__ float WarpMax(float v) {
  for (int mask = 16; mask > 0; mask >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask));
  return v;
}

// One thread block per row. bf16: a 16-byte vector copy. fp8: one warp per 128-channel group, 4 channels per
// lane; the group's amax gives its scale, and each value is divided by it (true division, as the CPU path).
__global__ void PackRows(const __nv_bfloat16* __restrict__ src, const int64_t* __restrict__ src_rows,
                         const int64_t* __restrict__ dst_offsets, int hidden, uint8_t* __restrict__ base,
                         int fp8) {
  const int64_t i = blockIdx.x;
  const __nv_bfloat16* in = src + src_rows[i] * hidden;
  uint8_t* out = base + dst_offsets[i];
  if (!fp8) {
    const uint4* in4 = reinterpret_cast<const uint4*>(in);
    uint4* out4 = reinterpret_cast<uint4*>(out);
    for (int v = threadIdx.x; v < hidden / 8; v += blockDim.x) out4[v] = in4[v];
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float* scales = reinterpret_cast<float*>(out + hidden);
  for (int g = warp; g < hidden / kBlock; g += warps) {
    float vals[4];
    float amax = 0.0f;
    for (int j = 0; j < 4; ++j) {
      vals[j] = __bfloat162float(in[g * kBlock + lane * 4 + j]);
      amax = fmaxf(amax, fabsf(vals[j]));
    }
    amax = WarpMax(amax);
    const float scale = fmaxf(amax, 1e-8f) / kFp8Max;
    for (int j = 0; j < 4; ++j) {
      __nv_fp8_e4m3 q(vals[j] / scale);
      out[g * kBlock + lane * 4 + j] = q.__x;
    }
    if (lane == 0) scales[g] = scale;
  }
}

// One thread block per row: packed row at base + src_offsets[i] -> output row dst_rows[i].
__global__ void UnpackRows(const uint8_t* __restrict__ base, const int64_t* __restrict__ src_offsets,
                           const int64_t* __restrict__ dst_rows, int hidden, uint8_t* __restrict__ out_data,
                           float* __restrict__ out_scales, int fp8) {
  const int64_t i = blockIdx.x;
  const uint8_t* in = base + src_offsets[i];
  const int64_t row = dst_rows[i];
  const int bytes = fp8 ? hidden : 2 * hidden;
  const uint4* in4 = reinterpret_cast<const uint4*>(in);
  uint4* out4 = reinterpret_cast<uint4*>(out_data + row * bytes);
  for (int v = threadIdx.x; v < bytes / 16; v += blockDim.x) out4[v] = in4[v];
  if (fp8) {
    const float* scales = reinterpret_cast<const float*>(in + hidden);
    for (int g = threadIdx.x; g < hidden / kBlock; g += blockDim.x) out_scales[row * (hidden / kBlock) + g] = scales[g];
  }
}

// One thread block per token: out[t] = sum over its slots k (in slot order) of weight[t, k] * row(t, k), in fp32,
// where row(t, k) is the bf16 row at base + slot_offsets[t * topk + k]; an offset < 0 contributes nothing.
__global__ void CombineTokens(const uint8_t* __restrict__ base, const int64_t* __restrict__ slot_offsets,
                              const float* __restrict__ weights, int topk, int hidden,
                              __nv_bfloat16* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x * 2; c < hidden; c += blockDim.x * 2) {
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int k = 0; k < topk; ++k) {
      const int64_t off = slot_offsets[t * topk + k];
      if (off < 0) continue;
      const float w = weights[t * topk + k];
      const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(base + off + 2 * c);
      acc0 += w * __bfloat162float(v.x);
      acc1 += w * __bfloat162float(v.y);
    }
    out[t * hidden + c] = __float2bfloat16(acc0);
    out[t * hidden + c + 1] = __float2bfloat16(acc1);
  }
}

cudaError_t Launched() { return cudaGetLastError(); }

}  // namespace

// ---- kernels ---------------------------------------------------------------------------------------------------

// Gathers n rows src[src_rows[i]] (bf16 [*, hidden]) into packed row slots at base + dst_offsets[i] (16-byte
// aligned), as bf16 rows or, when fp8 != 0, as fp8 rows with scales. hidden % 128 == 0.
MC_EP_API int mc_ep_pack_rows(const void* src, const int64_t* src_rows, const int64_t* dst_offsets, int64_t n,
                              int hidden, void* base, int fp8, void* stream) {
  if (n == 0) return cudaSuccess;
  if (hidden <= 0 || hidden % kBlock) return cudaErrorInvalidValue;
  PackRows<<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(src), src_rows, dst_offsets, hidden, static_cast<uint8_t*>(base), fp8);
  return Launched();
}

// Copies n packed rows at base + src_offsets[i] into row dst_rows[i] of out_data (bf16 [*, hidden], or e4m3
// [*, hidden] plus out_scales fp32 [*, hidden / 128] when fp8 != 0).
MC_EP_API int mc_ep_unpack_rows(const void* base, const int64_t* src_offsets, const int64_t* dst_rows, int64_t n,
                                int hidden, void* out_data, void* out_scales, int fp8, void* stream) {
  if (n == 0) return cudaSuccess;
  if (hidden <= 0 || hidden % kBlock) return cudaErrorInvalidValue;
  UnpackRows<<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(base), src_offsets, dst_rows, hidden, static_cast<uint8_t*>(out_data),
      static_cast<float*>(out_scales), fp8);
  return Launched();
}

// out bf16 [tokens, hidden] = per token, the weighted sum of its slots' bf16 rows (see CombineTokens).
MC_EP_API int mc_ep_combine_tokens(const void* base, const int64_t* slot_offsets, const float* weights,
                                   int64_t tokens, int topk, int hidden, void* out, void* stream) {
  if (tokens == 0) return cudaSuccess;
  if (hidden <= 0 || hidden % 2 || topk <= 0) return cudaErrorInvalidValue;
  CombineTokens<<<static_cast<unsigned>(tokens), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(base), slot_offsets, weights, topk, hidden, static_cast<__nv_bfloat16*>(out));
  return Launched();
}

// ---- runtime ---------------------------------------------------------------------------------------------------
// Device memory, IPC and copies are not here: the GPU path gets them from the platform layer's cuda platform
// (ep/cuda/device.py). What remains is what the platform has no call for.

MC_EP_API const char* mc_ep_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

// This library links its own CUDA runtime, whose current device is per thread: callers set it before each use.
MC_EP_API int mc_ep_set_device(int device) { return cudaSetDevice(device); }

// Waits for all work on the current device, on every stream (callers may switch streams between calls).
MC_EP_API int mc_ep_device_sync() { return cudaDeviceSynchronize(); }

// Pins host memory (e.g. the Transfer Engine buffer) so device<->host copies run at full speed.
MC_EP_API int mc_ep_host_register(void* ptr, size_t size) {
  return cudaHostRegister(ptr, size, cudaHostRegisterPortable);
}

MC_EP_API int mc_ep_host_unregister(void* ptr) { return cudaHostUnregister(ptr); }
