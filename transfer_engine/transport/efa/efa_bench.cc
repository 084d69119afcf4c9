// efa transport benchmark: the same transfers over the efa transport and over a yardstick, measured in the same
// run, printed as a table with ratios. The target engine runs in a child process (the conformance suite's
// conformance_peer, which loads libmc_transport_efa.so from MC_PLUGIN_DIR).
//
//   --provider=tcp;ofi_rxm   efa over libfabric's tcp provider against our tcp transport and a raw socket
//   --provider=shm           efa over libfabric's shm provider against memcpy
//
// Run both with `bazel run //transfer_engine/transport/efa:efa_bench` (efa_bench.sh). Writes only: 4 KiB and
// 1 MiB synchronous transfers one at a time, 64 MiB as one request, one batch of 128 x 64 KiB requests, and
// a 4 KiB synchronous write followed at once by a 4 KiB asynchronous one (Submit + WaitBatch; the pair timed).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/bench/baseline.h"
#include "transfer_engine/transport/conformance/target.h"

namespace mooncake::te::efa {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBuffer = 64 << 20;

struct Case {
  const char* name;
  size_t length;  // per request
  size_t count;   // requests per batch
  int iters;
  // One synchronous write, then one asynchronous write (Submit + WaitBatch) right after it: the pair's time.
  bool sync_then_async = false;
};
const Case kCases[] = {
    {"4 KiB", 4 << 10, 1, 500},
    {"1 MiB", 1 << 20, 1, 50},
    {"64 MiB", 64 << 20, 1, 3},
    {"128 x 64 KiB", 64 << 10, 128, 8},
    {"4K sync+async", 4 << 10, 1, 500, true},
};

// Seconds per batch of each method: the best of five rounds of `iters` batches, after one warm-up batch each;
// the methods take turns within every round, so they see the same machine load (this VM is shared). Negative
// when a method failed.
std::vector<double> TimeEach(const Case& c, const std::vector<std::function<bool()>>& methods) {
  std::vector<double> best(methods.size(), 1e30);
  for (size_t m = 0; m < methods.size(); ++m) {
    if (!methods[m]()) best[m] = -1;
  }
  for (int round = 0; round < 5; ++round) {
    for (size_t m = 0; m < methods.size(); ++m) {
      if (best[m] < 0) continue;
      auto t0 = Clock::now();
      bool ok = true;
      for (int i = 0; i < c.iters && ok; ++i) ok = methods[m]();
      double sec = std::chrono::duration<double>(Clock::now() - t0).count() / c.iters;
      best[m] = !ok ? -1 : std::min(best[m], sec);
    }
  }
  return best;
}

struct Engine {
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<conformance::Target> target;
  SegmentHandle handle = kInvalidSegment;
};

EngineOptions Options(const std::string& protocol) {
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  o.protocol = protocol;
  o.transports = {protocol};
  return o;
}

bool Open(const std::string& protocol, std::vector<char>& src, Engine* e) {
  conformance::TargetOptions to;
  to.engine = Options(protocol);
  to.buffer_size = kBuffer;
  auto target = conformance::StartPeerProcessTarget(to);
  if (!target.ok()) {
    fprintf(stderr, "target (%s): %s\n", protocol.c_str(), target.status().ToString().c_str());
    return false;
  }
  auto engine = TransferEngine::Create(Options(protocol));
  if (!engine.ok()) {
    fprintf(stderr, "engine (%s): %s\n", protocol.c_str(), engine.status().ToString().c_str());
    return false;
  }
  e->target = std::move(target.value());
  e->engine = std::move(engine.value());
  Status st = e->engine->RegisterMemory(src.data(), src.size());
  auto h = st.ok() ? e->engine->OpenSegment(e->target->segment_name()) : StatusOr<SegmentHandle>(st);
  if (!h.ok()) {
    fprintf(stderr, "open (%s): %s\n", protocol.c_str(), h.status().ToString().c_str());
    return false;
  }
  e->handle = *h;
  return true;
}

std::function<bool()> EngineWrite(Engine& e, std::vector<char>& src, const Case& c) {
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < c.count; ++i) {
    size_t off = (i * c.length) % kBuffer;
    reqs.push_back({OpCode::kWrite, src.data() + off, e.handle, e.target->buffer_address() + off, c.length});
  }
  if (c.sync_then_async) {
    std::vector<TransferRequest> next = reqs;
    next[0].source = static_cast<char*>(next[0].source) + c.length;
    next[0].target_address += c.length;
    return [&e, reqs, next] {
      Status st = e.engine->TransferSync(reqs, std::chrono::seconds(60));
      auto batch = st.ok() ? e.engine->AllocateBatch(1) : StatusOr<BatchId>(st);
      if (batch.ok()) st = e.engine->Submit(*batch, next);
      if (batch.ok() && st.ok()) {
        auto state = e.engine->WaitBatch(*batch, std::chrono::seconds(60));
        if (!state.ok()) st = state.status();
        else if (state->state != TransferState::kCompleted) st = e.engine->GetTaskError(*batch, 0);
      }
      if (batch.ok()) (void)e.engine->FreeBatch(*batch);
      if (!batch.ok()) st = batch.status();
      if (!st.ok()) fprintf(stderr, "transfer failed: %s\n", st.ToString().c_str());
      return st.ok();
    };
  }
  return [&e, reqs] {
    Status st = e.engine->TransferSync(reqs, std::chrono::seconds(60));
    if (!st.ok()) fprintf(stderr, "transfer failed: %s\n", st.ToString().c_str());
    return st.ok();
  };
}

std::string Cell(const Case& c, double s) {
  if (s < 0) return "failed";
  char buf[64];
  if (c.length * c.count <= (64 << 10)) {
    snprintf(buf, sizeof(buf), "%.2f us", s * 1e6);
  } else {
    snprintf(buf, sizeof(buf), "%.2f GB/s", c.length * c.count / s / 1e9);
  }
  return buf;
}

std::string Ratio(double efa, double other) {
  if (efa <= 0 || other <= 0) return "-";
  char buf[32];
  snprintf(buf, sizeof(buf), "%.2fx", other / efa);  // speed of efa relative to the other (time ratio)
  return buf;
}

int Run(const std::string& provider) {
  setenv("FI_PROVIDER", provider.c_str(), 1);
  char cwd[4096];
  if (!getenv("MC_PLUGIN_DIR") && getcwd(cwd, sizeof(cwd))) {
    setenv("MC_PLUGIN_DIR", (std::string(cwd) + "/transfer_engine/transport/efa").c_str(), 1);
  }
  std::vector<char> src(kBuffer);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131);
  Engine efa;
  if (!Open("efa", src, &efa)) return 1;
  printf("\nefa transport over libfabric provider '%s' (target in a child process, 127.0.0.1); writes%s\n",
         provider.c_str(), getenv("MC_EFA_IDLE_POLL_US") ? (std::string("; MC_EFA_IDLE_POLL_US=") +
                                                            getenv("MC_EFA_IDLE_POLL_US")).c_str()
                                                         : "");
  printf("ratio = how many times faster efa is (time of the other / time of efa), same run\n");
  if (provider == "shm") {
    std::vector<char> dst(kBuffer);
    printf("%-14s %14s %14s %10s\n", "size", "efa(shm)", "memcpy", "efa/memcpy");
    for (const Case& c : kCases) {
      auto t = TimeEach(c, {EngineWrite(efa, src, c), [&] {
                              for (size_t i = 0; i < c.count * (c.sync_then_async ? 2 : 1); ++i) {
                                size_t off = (i * c.length) % kBuffer;
                                memcpy(dst.data() + off, src.data() + off, c.length);
                              }
                              asm volatile("" ::: "memory");
                              return true;
                            }});
      double e = t[0], m = t[1];
      printf("%-14s %14s %14s %10s\n", c.name, Cell(c, e).c_str(), Cell(c, m).c_str(), Ratio(e, m).c_str());
      fflush(stdout);
    }
    return 0;
  }
  Engine tcp;
  if (!Open("tcp", src, &tcp)) return 1;
  bench::RawSocketServer server;
  auto port = server.Start("127.0.0.1");
  bench::RawSocketClient raw;
  if (!port.ok() || !raw.Connect("127.0.0.1", *port).ok()) {
    fprintf(stderr, "raw socket setup failed\n");
    return 1;
  }
  printf("%-14s %14s %14s %14s %9s %9s\n", "size", "efa(tcp)", "tcp transport", "raw socket", "efa/tcp", "efa/raw");
  for (const Case& c : kCases) {
    auto times = TimeEach(c, {EngineWrite(efa, src, c), EngineWrite(tcp, src, c),
                              [&] { return raw.Write(src.data(), c.length, c.count * (c.sync_then_async ? 2 : 1)).ok(); }});
    double e = times[0], t = times[1], r = times[2];
    printf("%-14s %14s %14s %14s %9s %9s\n", c.name, Cell(c, e).c_str(), Cell(c, t).c_str(), Cell(c, r).c_str(),
           Ratio(e, t).c_str(), Ratio(e, r).c_str());
    fflush(stdout);
  }
  server.Stop();
  return 0;
}

}  // namespace
}  // namespace mooncake::te::efa

int main(int argc, char** argv) {
  std::string provider = "tcp;ofi_rxm";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--provider=", 0) == 0) {
      provider = a.substr(11);
    } else {
      fprintf(stderr, "usage: %s [--provider=tcp;ofi_rxm|shm]\n", argv[0]);
      return 2;
    }
  }
  return mooncake::te::efa::Run(provider);
}
