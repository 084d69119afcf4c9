// The TCP transport's data listener under descriptor exhaustion and connection bursts, through the engine.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "transfer_engine/api/engine.h"

namespace mooncake::te {
namespace {

std::unique_ptr<TransferEngine> MakeEngine() {
  EngineOptions o;
  o.transports = {"tcp"};
  o.local_server_name = "127.0.0.1";
  o.metadata_conn = "P2PHANDSHAKE";
  auto e = TransferEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e.value());
}

nlohmann::json Stats(const TransferEngine& e) { return nlohmann::json::parse(e.StatsJson()); }

// A fresh engine writes 1 MiB of `fill` into `target` through its data port, and it arrives.
void ExpectServesATransfer(TransferEngine& target, uint8_t fill) {
  auto source = MakeEngine();
  std::vector<uint8_t> src(1 << 20, fill), dst(1 << 20, 0);
  ASSERT_TRUE(source->RegisterMemory(src.data(), src.size()).ok());
  ASSERT_TRUE(target.RegisterMemory(dst.data(), dst.size()).ok());
  auto h = source->OpenSegment(target.segment_name());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  TransferRequest r;
  r.opcode = OpCode::kWrite;
  r.source = src.data();
  r.target = *h;
  r.target_address = reinterpret_cast<uint64_t>(dst.data());
  r.length = src.size();
  Status st = source->TransferSync({r}, std::chrono::seconds(10));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(dst, src);
  ASSERT_TRUE(target.UnregisterMemory(dst.data()).ok());
}

int OpenDescriptors() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (d && readdir(d)) ++n;
  if (d) closedir(d);
  return n;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// When the process runs out of file descriptors, the TCP data listener neither spins on its (still readable)
// socket nor stays shut: it makes room by closing its quietest connection and serves again afterwards.
TEST(EngineTcpListenerTest, RunningOutOfDescriptorsNeitherSpinsNorLocksOut) {
  auto target = MakeEngine();
  uint16_t port = Stats(*target)["listeners"]["tcp"]["port"].get<uint16_t>();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = OpenDescriptors() + 24;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> clients;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  while (clients.size() < 64) {  // each one costs a descriptor here and one on the target's side
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) break;
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    clients.push_back(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double before = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  double used = CpuSeconds() - before;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  for (int fd : clients) close(fd);
  EXPECT_LT(used, 0.3) << "the process used " << used << " s of CPU in 1 s while out of descriptors";
  EXPECT_GE(Stats(*target)["listeners"]["tcp"]["evicted"].get<uint64_t>(), 1u);

  ExpectServesATransfer(*target, 7);
}


// A burst of connections far beyond the data port's limit: evictions are asynchronous, yet the number of
// open server connections stays within the limit plus the bounded pending evictions (each new connection
// picks another victim, or is refused), and the port still serves a transfer afterwards.
TEST(EngineTcpListenerTest, ConnectionBurstStaysWithinTheLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::max<rlim_t>(64, OpenDescriptors() + 48);  // the limit is half the descriptor limit
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  auto target = MakeEngine();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  auto tcp = Stats(*target)["listeners"]["tcp"];
  const size_t limit = tcp["limit"].get<size_t>();
  ASSERT_LT(limit, 200u);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(tcp["port"].get<uint16_t>());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> clients;
  for (size_t i = 0; i < 4 * limit + 64; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    clients.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  tcp = Stats(*target)["listeners"]["tcp"];
  EXPECT_LE(tcp["peak"].get<size_t>(), limit + limit / 8 + 1) << tcp.dump();
  EXPECT_LE(tcp["open"].get<size_t>(), limit) << tcp.dump();
  EXPECT_GE(tcp["evicted"].get<uint64_t>() + tcp["refused"].get<uint64_t>(), 3 * limit) << tcp.dump();
  for (int fd : clients) close(fd);

  ExpectServesATransfer(*target, 9);
}

}  // namespace
}  // namespace mooncake::te
