// cxl_bench: the cxl transport against memcpy in the same run.
//
//   bazel run -c opt //transfer_engine/transport/cxl:cxl_bench -- [--size_mib=64] [--iters=20] [--dir=/dev/shm]
//
// Two engines of this process share a file standing in for the device (in --dir). Each iteration times a plain
// memcpy between the same local buffer and the same device range, then one TransferSync write (or read) of
// that range through the engine; the reported ratio is the median of transfer rate / memcpy rate. Run with
// cache flushes on (the default: what memory shared without coherence needs) and off (cxl.flush=0).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/cxl/cxl_cache.h"

using namespace mooncake::te;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Flag(int argc, char** argv, const char* name, const char* fallback) {
  std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t size = std::stoull(Flag(argc, argv, "size_mib", "64")) << 20;
  const int iters = std::stoi(Flag(argc, argv, "iters", "20"));
  const std::string dir = Flag(argc, argv, "dir", "/dev/shm");
  const uint64_t device_size = ((size + (4 << 20)) + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  std::string path = dir + "/mc-cxl-bench-XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(device_size)) != 0) {
    perror("device file");
    return 1;
  }
  close(fd);
  setenv("MC_CXL_DEV_PATH", path.c_str(), 1);
  setenv("MC_CXL_DEV_SIZE", std::to_string(device_size).c_str(), 1);
  std::printf("cxl_bench: %zu MiB per transfer, %d iterations, device file %s (%llu MiB), cache flushes: %s\n",
              size >> 20, iters, path.c_str(), static_cast<unsigned long long>(device_size >> 20),
              cxl::FlushKindName(cxl::CpuFlushKind()));
  int rc = 0;
  {
    // The target: maps the payload of the device itself and registers it.
    EngineOptions o;
    o.local_server_name = "127.0.0.1";
    o.transports = {"cxl"};
    o.protocol = "cxl";
    auto target = TransferEngine::Create(o);
    if (!target.ok()) {
      std::fprintf(stderr, "target engine: %s\n", target.status().ToString().c_str());
      unlink(path.c_str());
      return 1;
    }
    int dfd = open(path.c_str(), O_RDWR);
    auto* dev = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, dfd, 2 << 20));
    close(dfd);
    memset(dev, 1, size);
    Status st = (*target)->RegisterMemory(dev, size);
    std::vector<char> local(size, 2);
    for (bool flush : {true, false}) {
      EngineOptions io = o;
      io.transport_options["cxl.flush"] = flush ? "1" : "0";
      auto a = TransferEngine::Create(io);
      if (!st.ok() || !a.ok() || !(*a)->RegisterMemory(local.data(), size).ok()) {
        std::fprintf(stderr, "setup failed: %s\n", (st.ok() ? a.status() : st).ToString().c_str());
        rc = 1;
        break;
      }
      auto peer = (*a)->OpenSegment((*target)->segment_name());
      if (!peer.ok()) {
        rc = 1;
        break;
      }
      for (OpCode op : {OpCode::kWrite, OpCode::kRead}) {
        std::vector<double> ratios, rates, base;
        for (int i = 0; i < iters; ++i) {
          auto t0 = Clock::now();
          if (op == OpCode::kWrite) memcpy(dev, local.data(), size);
          else memcpy(local.data(), dev, size);
          auto t1 = Clock::now();
          TransferRequest r{op, local.data(), *peer, reinterpret_cast<uint64_t>(dev), size};
          Status s = (*a)->TransferSync({r}, std::chrono::seconds(60));
          auto t2 = Clock::now();
          if (!s.ok()) {
            std::fprintf(stderr, "transfer failed: %s\n", s.ToString().c_str());
            rc = 1;
            break;
          }
          double mem = size / Seconds(t0, t1) / 1e9, xfer = size / Seconds(t1, t2) / 1e9;
          base.push_back(mem);
          rates.push_back(xfer);
          ratios.push_back(xfer / mem);
        }
        std::printf("%-5s flush=%-3s memcpy %6.2f GB/s  cxl %6.2f GB/s  ratio %.2f (median of %d)\n",
                    op == OpCode::kWrite ? "write" : "read", flush ? "on" : "off", Median(base), Median(rates),
                    Median(ratios), iters);
      }
    }
    munmap(dev, size);
  }
  unlink(path.c_str());
  return rc;
}
