#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_CACHE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_CACHE_H_

// Cache maintenance for memory that other hosts share without hardware coherence (CXL 2.0/3.x shared memory,
// which is not coherent across hosts by default). A writer must push its lines out to the device before it
// says the data is there; a reader must drop any line it may hold from an earlier read before it reads again.
// On x86 that is clwb (else clflushopt, else clflush) per 64-byte line, then sfence; elsewhere a no-op that
// says so (FlushKind::kNone). Thread-safe; no state beyond the CPU feature probe made once.

#include <cstddef>

namespace mooncake::te::cxl {

enum class FlushKind { kNone, kClflush, kClflushopt, kClwb };
/// What this CPU offers (CPUID leaf 7: clwb bit 24, clflushopt bit 23; clflush from leaf 1).
FlushKind CpuFlushKind();
const char* FlushKindName(FlushKind k);

constexpr size_t kCacheLine = 64;

/// Writes every cache line of [p, p+n) back to memory (clwb keeps a clean copy; clflushopt/clflush evict it),
/// then sfence: once this returns the bytes are in the device for any host that reads them uncached.
void WriteBack(const void* p, size_t n);
/// Evicts every cache line of [p, p+n) (clflushopt, else clflush; clwb would keep a possibly stale copy),
/// then fences: the next loads of the range come from the device, not from lines cached before another host
/// wrote it.
void Invalidate(const void* p, size_t n);

/// memcpy into shared device memory followed by WriteBack of the destination (`flush` false: plain memcpy).
void CopyToDevice(void* dst, const void* src, size_t n, bool flush);
/// Invalidate of the source followed by memcpy out of shared device memory (`flush` false: plain memcpy).
void CopyFromDevice(void* dst, const void* src, size_t n, bool flush);

}  // namespace mooncake::te::cxl

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_CACHE_H_
