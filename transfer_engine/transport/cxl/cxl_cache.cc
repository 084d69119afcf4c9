#include "transfer_engine/transport/cxl/cxl_cache.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MC_CXL_X86 1
#endif

namespace mooncake::te::cxl {

FlushKind CpuFlushKind() {
  static const FlushKind kind = [] {
#ifdef MC_CXL_X86
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      if (b & (1u << 24)) return FlushKind::kClwb;
      if (b & (1u << 23)) return FlushKind::kClflushopt;
    }
    if (__get_cpuid(1, &a, &b, &c, &d) && (d & (1u << 19))) return FlushKind::kClflush;
#endif
    return FlushKind::kNone;
  }();
  return kind;
}

const char* FlushKindName(FlushKind k) {
  switch (k) {
    case FlushKind::kClwb: return "clwb";
    case FlushKind::kClflushopt: return "clflushopt";
    case FlushKind::kClflush: return "clflush";
    case FlushKind::kNone: break;
  }
  return "none";
}

namespace {

#ifdef MC_CXL_X86
// The instructions by their encodings (no -mclwb/-mclflushopt needed; the CPU check above gates their use).
inline void Clwb(const char* p) { asm volatile(".byte 0x66, 0x0f, 0xae, 0x30" : "+m"(*(volatile char*)p) : "a"(p)); }
inline void Clflushopt(const char* p) {
  asm volatile(".byte 0x66, 0x0f, 0xae, 0x38" : "+m"(*(volatile char*)p) : "a"(p));
}
inline void Clflush(const char* p) { asm volatile("clflush %0" : "+m"(*(volatile char*)p)); }
#endif

template <typename Op>
void EachLine(const void* p, size_t n, Op op) {
  auto begin = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t{kCacheLine} - 1);
  auto end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = begin; a < end; a += kCacheLine) op(reinterpret_cast<const char*>(a));
}

}  // namespace

void WriteBack(const void* p, size_t n) {
  if (n == 0) return;
#ifdef MC_CXL_X86
  switch (CpuFlushKind()) {
    case FlushKind::kClwb: EachLine(p, n, Clwb); break;
    case FlushKind::kClflushopt: EachLine(p, n, Clflushopt); break;
    case FlushKind::kClflush: EachLine(p, n, Clflush); break;
    case FlushKind::kNone: break;
  }
  asm volatile("sfence" ::: "memory");
#else
  (void)p;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

void Invalidate(const void* p, size_t n) {
  if (n == 0) return;
#ifdef MC_CXL_X86
  switch (CpuFlushKind()) {
    case FlushKind::kClwb:
    case FlushKind::kClflushopt: EachLine(p, n, Clflushopt); break;
    case FlushKind::kClflush: EachLine(p, n, Clflush); break;
    case FlushKind::kNone: break;
  }
  // clflushopt is ordered by sfence/mfence only; mfence also keeps the loads that follow after it.
  asm volatile("mfence" ::: "memory");
#else
  (void)p;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

void CopyToDevice(void* dst, const void* src, size_t n, bool flush) {
  std::memcpy(dst, src, n);
  if (flush) WriteBack(dst, n);
}

void CopyFromDevice(void* dst, const void* src, size_t n, bool flush) {
  if (flush) Invalidate(src, n);
  std::memcpy(dst, src, n);
}

}  // namespace mooncake::te::cxl
