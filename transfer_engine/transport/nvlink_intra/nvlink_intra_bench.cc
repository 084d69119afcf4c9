// nvlink_intra between two engines of this process against a plain device-to-device copy of the same platform
// (CopyAsync + Wait), interleaved in one run, for 1 MiB and 64 MiB writes and reads. On the host emulation
// (MC_PLATFORM_EMULATION=1, set by `bazel run`) both are memcpy on the emulation's copy thread, so the ratio is the
// transport's own overhead (descriptor lookup, cached mapping, slicing, completion), not NVLink's speed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"

using namespace mooncake::te;  // NOLINT: a small benchmark binary

namespace {

constexpr size_t kBuffer = 64 << 20;

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::max(1, atoi(argv[1])) : 5;
  auto cuda = PlatformRegistry::Get().ForType(MemoryType::kCuda);
  if (!cuda) {
    fprintf(stderr, "no usable CUDA platform (set MC_PLATFORM_EMULATION=1 for the emulation)\n");
    return 2;
  }
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  auto a = TransferEngine::Create(o);
  auto b = TransferEngine::Create(o);
  if (!a.ok() || !b.ok()) {
    fprintf(stderr, "engines: %s %s\n", a.status().ToString().c_str(), b.status().ToString().c_str());
    return 1;
  }
  auto src = cuda->Allocate(kBuffer, AllocationKind::kDevice, 0);
  auto dst = cuda->Allocate(kBuffer, AllocationKind::kDevice, 0);
  if (!src.ok() || !dst.ok()) return 1;
  memset(*src, 1, kBuffer);
  memset(*dst, 2, kBuffer);  // emulated device memory is host memory: touch it before timing
  if (!(*a)->RegisterMemory(*src, kBuffer).ok() || !(*b)->RegisterMemory(*dst, kBuffer).ok()) return 1;
  auto peer = (*a)->OpenSegment((*b)->segment_name());
  if (!peer.ok()) return 1;
  printf("nvlink_intra vs plain device-to-device copy (%s), %d interleaved rounds, medians\n", cuda->name().c_str(),
         rounds);
  for (size_t block : {size_t{1} << 20, size_t{64} << 20}) {
    for (OpCode op : {OpCode::kWrite, OpCode::kRead}) {
      const size_t n = std::max<size_t>(1, (256u << 20) / block);
      std::vector<double> te, plain, ratio;
      for (int r = 0; r <= rounds; ++r) {  // round 0 warms up (mapping, first copies)
        auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < n; ++i) {
          size_t off = (i * block) % kBuffer;
          TransferRequest req{op, static_cast<char*>(*src) + off, *peer, reinterpret_cast<uint64_t>(*dst) + off, block};
          Status st = (*a)->TransferSync({req}, std::chrono::seconds(30));
          if (!st.ok()) {
            fprintf(stderr, "transfer: %s\n", st.ToString().c_str());
            return 1;
          }
        }
        double t_te = Seconds(std::chrono::steady_clock::now() - t0);
        t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < n; ++i) {
          size_t off = (i * block) % kBuffer;
          char* from = static_cast<char*>(op == OpCode::kWrite ? *src : *dst) + off;
          char* to = static_cast<char*>(op == OpCode::kWrite ? *dst : *src) + off;
          auto c = cuda->CopyAsync(to, from, block, 0);
          if (!c.ok() || !(*c)->Wait().ok()) return 1;
        }
        double t_plain = Seconds(std::chrono::steady_clock::now() - t0);
        if (r == 0) continue;
        te.push_back(n * block / t_te / 1e9);
        plain.push_back(n * block / t_plain / 1e9);
        ratio.push_back(t_plain / t_te);
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
      printf("%3zu MiB %-5s nvlink_intra %.2f GB/s  plain copy %.2f GB/s  ratio %.2f [%.2f..%.2f]\n", block >> 20,
             op == OpCode::kWrite ? "write" : "read", median(te), median(plain), median(ratio), *lo, *hi);
    }
  }
  a->reset();
  b->reset();
  int rc = 0;
  for (void* p : {*src, *dst}) {
    Status freed = cuda->Free(p, kBuffer, AllocationKind::kDevice);
    if (!freed.ok()) {
      fprintf(stderr, "free: %s\n", freed.ToString().c_str());
      rc = 1;
    }
  }
  return rc;
}
