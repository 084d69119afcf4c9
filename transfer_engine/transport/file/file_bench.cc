// The file transport against fio, same file, same pattern, same run: sequential 1 MiB and random 4 KiB reads and
// writes at queue depth 1 and 32, O_DIRECT and io_uring on both sides.
//
//   bazel run //transfer_engine/transport/file:bench -- [--dir=/tmp] [--size_mb=512] [--seconds=2] [--rounds=2]
//       [--batches=8]
//
// Each case runs fio, then the engine, `rounds` times interleaved; the best of each side is compared, and the
// median of each side (robust to one outlier run on a shared machine). The engine
// path is the whole public API: a file segment published in an in-process metadata store, TransferSync for queue
// depth 1, and for depth 32 --batches=8 batches of four requests kept in flight (a finished batch is replaced at once);
// like fio, one memory buffer per request in flight, reused.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/file/file_segment.h"

namespace mooncake::te::file {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string dir = "/tmp";
  uint64_t size_mb = 512;
  double seconds = 2;
  int rounds = 2;
  int batches = 8;  // batches kept in flight at depth 32 (depth / batches requests each); 0: one TransferSync
  std::string only;  // --only=<substring of a case name>: run just the matching cases
};

struct Case {
  const char* name;
  bool write;
  bool random;
  size_t bs;
  int depth;
};

std::string FioRw(const Case& c) {
  return c.random ? (c.write ? "randwrite" : "randread") : (c.write ? "write" : "read");
}

// Bytes per second fio reports, or -1.
double RunFio(const Args& a, const std::string& file, const Case& c) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "fio --name=bench --filename=%s --size=%llum --direct=1 --ioengine=io_uring --rw=%s --bs=%zu "
           "--iodepth=%d --time_based --runtime=%.1f --norandommap --randrepeat=0 --output-format=json 2>/dev/null",
           file.c_str(), static_cast<unsigned long long>(a.size_mb), FioRw(c).c_str(), c.bs, c.depth, a.seconds);
  FILE* p = popen(cmd, "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_object() || !j.contains("jobs") || j["jobs"].empty()) {
    fprintf(stderr, "fio output unreadable: %s\n", out.substr(0, 400).c_str());
    return -1;
  }
  const auto& side = j["jobs"][0][c.write ? "write" : "read"];
  return side.value("bw_bytes", 0.0);
}

struct Engine {
  std::unique_ptr<TransferEngine> e;
  SegmentHandle seg = kInvalidSegment;
  char* mem = nullptr;
  size_t mem_size = 64 << 20;
  std::unique_ptr<MetadataBackend> published;
};

// Bytes per second through the engine.
double RunEngine(const Args& a, Engine& en, const Case& c) {
  const uint64_t file_size = a.size_mb << 20;
  std::mt19937_64 rng(c.bs * 31 + c.depth);
  uint64_t seq = 0;
  size_t local = 0;
  auto next = [&]() {
    TransferRequest r;
    r.opcode = c.write ? OpCode::kWrite : OpCode::kRead;
    uint64_t off;
    if (c.random) {
      off = (rng() % (file_size / c.bs)) * c.bs;
    } else {
      off = seq;
      seq = (seq + c.bs) % (file_size / c.bs * c.bs);
    }
    r.source = en.mem + local;  // like fio: one buffer per request in flight, reused
    local = (local + c.bs) % (static_cast<size_t>(c.depth) * c.bs);
    r.target = en.seg;
    r.target_address = kFileSegmentBase + off;
    r.length = c.bs;
    return r;
  };
  const auto end = Clock::now() + std::chrono::duration<double>(a.seconds);
  const auto start = Clock::now();
  uint64_t bytes = 0;
  if (c.depth == 1 || a.batches == 0) {
    // Depth 1, or (--batches=0) `depth` requests per TransferSync: the caller's thread drives them all.
    while (Clock::now() < end) {
      std::vector<TransferRequest> reqs;
      for (int i = 0; i < c.depth; ++i) reqs.push_back(next());
      Status st = en.e->TransferSync(reqs, std::chrono::seconds(30));
      if (!st.ok()) {
        fprintf(stderr, "transfer failed: %s\n", st.ToString().c_str());
        return -1;
      }
      bytes += static_cast<uint64_t>(c.depth) * c.bs;
    }
  } else {
    const int kBatches = a.batches, per = std::max(1, c.depth / kBatches);
    std::deque<BatchId> inflight;
    auto submit = [&]() -> bool {
      auto b = en.e->AllocateBatch(per);
      if (!b.ok()) return false;
      std::vector<TransferRequest> reqs;
      for (int i = 0; i < per; ++i) reqs.push_back(next());
      if (!en.e->Submit(*b, reqs).ok()) return false;
      inflight.push_back(*b);
      return true;
    };
    for (int i = 0; i < kBatches; ++i) {
      if (!submit()) return -1;
    }
    while (!inflight.empty()) {
      BatchId b = inflight.front();
      inflight.pop_front();
      auto st = en.e->WaitBatch(b, std::chrono::seconds(30));
      if (!st.ok() || st->state != TransferState::kCompleted) {
        fprintf(stderr, "batch failed\n");
        return -1;
      }
      bytes += static_cast<uint64_t>(per) * c.bs;
      (void)en.e->FreeBatch(b);
      if (Clock::now() < end && !submit()) return -1;
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  return bytes / secs;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto val = [&](const char* k) -> const char* {
      size_t n = strlen(k);
      return s.compare(0, n, k) == 0 ? s.c_str() + n : nullptr;
    };
    if (const char* v = val("--dir=")) a.dir = v;
    else if (const char* v = val("--size_mb=")) a.size_mb = strtoull(v, nullptr, 10);
    else if (const char* v = val("--seconds=")) a.seconds = atof(v);
    else if (const char* v = val("--rounds=")) a.rounds = atoi(v);
    else if (const char* v = val("--batches=")) a.batches = std::max(0, atoi(v));
    else if (const char* v = val("--only=")) a.only = v;
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (system("fio --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "fio is not installed (Debian package fio)\n");
    return 2;
  }
  std::string file = a.dir + "/mc_file_bench_" + std::to_string(getpid());
  {
    int fd = open(file.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) {
      perror("create bench file");
      return 1;
    }
    std::vector<char> chunk(1 << 20);
    std::mt19937 rng(1);
    for (auto& ch : chunk) ch = static_cast<char>(rng());
    for (uint64_t i = 0; i < a.size_mb; ++i) {
      if (write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) {
        perror("write bench file");
        return 1;
      }
    }
    fsync(fd);
    close(fd);
  }
  Engine en;
  EngineOptions o;
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "memkv://bench";
  o.transport_options["file.allowed_dirs"] = "/";  // its own scratch files, wherever they are
  auto e = TransferEngine::Create(o);
  if (!e.ok()) {
    fprintf(stderr, "engine: %s\n", e.status().ToString().c_str());
    return 1;
  }
  en.e = std::move(e.value());
  void* mem = nullptr;
  if (posix_memalign(&mem, 4096, en.mem_size) != 0) return 1;
  memset(mem, 0x5a, en.mem_size);
  en.mem = static_cast<char*>(mem);
  if (!en.e->RegisterMemory(en.mem, en.mem_size).ok()) return 1;
  auto pub = PublishFileSegment(o.metadata_conn, "nvmeof/bench", {{file, 0, {}}});
  if (!pub.ok()) {
    fprintf(stderr, "publish: %s\n", pub.status().ToString().c_str());
    return 1;
  }
  en.published = std::move(pub.value());
  auto seg = en.e->OpenSegment("nvmeof/bench");
  if (!seg.ok()) return 1;
  en.seg = *seg;

  const Case cases[] = {
      {"seq read  1MiB qd1 ", false, false, 1 << 20, 1},  {"seq read  1MiB qd32", false, false, 1 << 20, 32},
      {"seq write 1MiB qd1 ", true, false, 1 << 20, 1},   {"seq write 1MiB qd32", true, false, 1 << 20, 32},
      {"rand read  4KiB qd1 ", false, true, 4096, 1},     {"rand read  4KiB qd32", false, true, 4096, 32},
      {"rand write 4KiB qd1 ", true, true, 4096, 1},      {"rand write 4KiB qd32", true, true, 4096, 32},
  };
  printf("file %s (%llu MiB), %.1f s per run, best of %d interleaved runs per side\n", file.c_str(),
         static_cast<unsigned long long>(a.size_mb), a.seconds, a.rounds);
  printf("%-22s %14s %14s %8s %10s   (runs: fio | engine, MB/s)\n", "case", "fio MB/s", "engine MB/s", "ratio",
         "median");
  int below = 0, below_median = 0;
  for (const auto& c : cases) {
    if (!a.only.empty() && std::string(c.name).find(a.only) == std::string::npos) continue;
    double best_fio = -1, best_eng = -1;
    std::vector<double> fios, engs;
    std::string runs;
    for (int r = 0; r < a.rounds; ++r) {
      double f = RunFio(a, file, c);
      double g = RunEngine(a, en, c);
      best_fio = std::max(best_fio, f);
      best_eng = std::max(best_eng, g);
      fios.push_back(f);
      engs.push_back(g);
      char buf[64];
      snprintf(buf, sizeof(buf), "%s%.1f|%.1f", r ? ", " : "", f / 1e6, g / 1e6);
      runs += buf;
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    double ratio = best_fio > 0 ? best_eng / best_fio : 0;
    double med_fio = median(fios);
    double ratio_median = med_fio > 0 ? median(engs) / med_fio : 0;
    if (ratio < 0.9) ++below;
    if (ratio_median < 0.9) ++below_median;
    printf("%-22s %14.1f %14.1f %7.2fx %9.2fx   (%s)\n", c.name, best_fio / 1e6, best_eng / 1e6, ratio,
           ratio_median, runs.c_str());
    fflush(stdout);
  }
  auto verdict = [](int n) {
    return n == 0 ? std::string("every case >= 0.9x fio") : std::to_string(n) + " case(s) below 0.9x fio";
  };
  printf("best of runs: %s; median of runs: %s\n", verdict(below).c_str(), verdict(below_median).c_str());
  printf("engine stats: %s\n", en.e->StatsJson().c_str());
  en.e.reset();
  unlink(file.c_str());
  free(mem);
  return 0;
}

}  // namespace
}  // namespace mooncake::te::file

int main(int argc, char** argv) { return mooncake::te::file::Main(argc, argv); }
