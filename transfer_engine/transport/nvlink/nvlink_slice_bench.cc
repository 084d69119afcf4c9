// Slices per second through the nvlink transport on the host EMULATION (not a GPU): two engines of this process,
// `nvlink.slice_size` 4 KiB, each submission one write of --mib MiB (--mib * 256 slices into one buffer),
// --rounds submissions. Run with MC_PLATFORM_EMULATION=1 MC_NVLINK_DOMAIN=<any>. Prints slices/s and the peer
// epoch-table reads per submission (the transport's "epoch_reads").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/platform/platform.h"

using namespace mooncake::te;

int main(int argc, char** argv) {
  size_t mib = 16, rounds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--mib") == 0) mib = strtoull(argv[i + 1], nullptr, 10);
    if (strcmp(argv[i], "--rounds") == 0) rounds = strtoull(argv[i + 1], nullptr, 10);
  }
  auto dev = PlatformRegistry::Get().ForType(MemoryType::kCuda);
  if (!dev || mib == 0 || rounds == 0) {
    fprintf(stderr, "needs MC_PLATFORM_EMULATION=1 (no CUDA platform), --mib and --rounds > 0\n");
    return 2;
  }
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = "nvlink";
  o.transport_options = {{"nvlink.slice_size", "4096"}};
  auto a = TransferEngine::Create(o);
  auto b = TransferEngine::Create(o);
  const size_t len = mib << 20;
  auto src = dev->Allocate(len, AllocationKind::kFabric, 0);
  auto dst = dev->Allocate(len, AllocationKind::kFabric, 0);
  if (!a.ok() || !b.ok() || !src.ok() || !dst.ok() || !(*a)->RegisterMemory(*src, len).ok() ||
      !(*b)->RegisterMemory(*dst, len).ok()) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  auto peer = (*a)->OpenSegment((*b)->segment_name());
  if (!peer.ok()) return 1;
  TransferRequest r{OpCode::kWrite, *src, *peer, reinterpret_cast<uint64_t>(*dst), len};
  if (!(*a)->TransferSync({r}, std::chrono::seconds(60)).ok()) return 1;  // warm: mapping and table imported
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < rounds; ++i) {
    Status st = (*a)->TransferSync({r}, std::chrono::seconds(60));
    if (!st.ok()) {
      fprintf(stderr, "transfer failed: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto stats = nlohmann::json::parse((*a)->StatsJson())["nvlink"][(*b)->segment_name()];
  const double slices = static_cast<double>(rounds * (len / 4096));
  printf("%zu submissions x %zu slices of 4 KiB: %.0f slices/s (%.2f s); epoch_reads per submission: %.1f\n", rounds,
         len / 4096, slices / s, s, stats.value("epoch_reads", 0.0) / static_cast<double>(rounds + 1));
  a->reset();
  b->reset();
  (void)dev->Free(*src, len, AllocationKind::kFabric);
  (void)dev->Free(*dst, len, AllocationKind::kFabric);
  return 0;
}
