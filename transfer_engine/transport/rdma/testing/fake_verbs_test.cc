// The fake verbs provider's semantics: what the rdma transport's tests rely on.

#include "transfer_engine/transport/rdma/testing/fake_verbs.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace mooncake::te::rdma::fake {
namespace {

using Clock = std::chrono::steady_clock;

const VerbsApi& V() { return *FakeVerbs(); }

// Runs first (gtest keeps the order of a file): without a state directory there is no device, as on this host.
TEST(FakeVerbsNoState, ListFailsWithEnosys) {
  unsetenv("MC_RDMA_FAKE_STATE");
  int n = -1;
  errno = 0;
  EXPECT_EQ(V().get_device_list(&n), nullptr);
  EXPECT_EQ(errno, ENOSYS);
  EXPECT_EQ(n, 0);
}

std::string StateDir() {
  static std::string dir = [] {
    const char* t = getenv("TEST_TMPDIR");
    std::string d = std::string(t ? t : "/tmp") + "/fake_verbs_state_XXXXXX";
    char* made = mkdtemp(d.data());
    return std::string(made ? made : "/tmp");
  }();
  return dir;
}

// One side of a connection: context, PD, CQ with a channel, an MR over `mem`, one RC QP.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<uint8_t> mem = std::vector<uint8_t>(1 << 20);

  void Open(ibv_device* dev, int access, int cqe = 256) {
    ctx = V().open_device(dev);
    ASSERT_NE(ctx, nullptr);
    pd = V().alloc_pd(ctx);
    ch = V().create_comp_channel(ctx);
    cq = V().create_cq(ctx, cqe, this, ch, 0);
    ASSERT_TRUE(pd && ch && cq);
    mr = V().reg_mr(pd, mem.data(), mem.size(), access);
    ASSERT_NE(mr, nullptr);
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 2;
    init.cap.max_recv_sge = 1;
    qp = V().create_qp(pd, &init);
    ASSERT_NE(qp, nullptr);
  }
  ibv_gid Gid(int index = 2) const {
    ibv_gid g;
    V().query_gid(ctx, 1, index, &g);
    return g;
  }
  int ToInit() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    return V().modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  int ToRtr(uint32_t dest_qpn, const ibv_gid& dgid, ibv_mtu mtu = IBV_MTU_1024, uint32_t rq_psn = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = dgid;
    a.ah_attr.grh.sgid_index = 2;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    return V().modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  }
  int ToRts(uint32_t sq_psn = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = sq_psn;
    a.max_rd_atomic = 16;
    return V().modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                             IBV_QP_MAX_QP_RD_ATOMIC);
  }
  int Post(ibv_wr_opcode op, uint64_t local_off, uint64_t remote_addr, uint32_t rkey, uint32_t len,
           uint64_t id = 1, uint32_t lkey = 0) {
    ibv_sge sge{reinterpret_cast<uint64_t>(mem.data()) + local_off, len, lkey ? lkey : mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return V().post_send(qp, &wr, &bad);
  }
  // Waits on the completion channel (a real fd) for one completion.
  ibv_wc Wait(int timeout_ms = 5000) {
    ibv_wc wc{};
    auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (V().poll_cq(cq, 1, &wc) == 1) return wc;
      V().req_notify_cq(cq, 0);
      if (V().poll_cq(cq, 1, &wc) == 1) return wc;
      pollfd p{ch->fd, POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
      if (left <= 0 || poll(&p, 1, left) != 1) {
        wc.status = IBV_WC_GENERAL_ERR;
        wc.wr_id = ~0ULL;
        return wc;
      }
      ibv_cq* got = nullptr;
      void* cookie = nullptr;
      EXPECT_EQ(V().get_cq_event(ch, &got, &cookie), 0);
      EXPECT_EQ(got, cq);
      EXPECT_EQ(cookie, this);
      V().ack_cq_events(got, 1);
    }
  }
  void Close() {
    if (qp) {
      EXPECT_EQ(V().destroy_qp(qp), 0);
    }
    if (mr) V().dereg_mr(mr);
    if (cq) V().destroy_cq(cq);
    if (ch) V().destroy_comp_channel(ch);
    if (pd) V().dealloc_pd(pd);
    if (ctx) {
      EXPECT_EQ(V().close_device(ctx), 0);
    }
    qp = nullptr;
    mr = nullptr;
    cq = nullptr;
    ch = nullptr;
    pd = nullptr;
    ctx = nullptr;
  }
};

class FakeVerbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MC_RDMA_FAKE_STATE", StateDir().c_str(), 1);
    setenv("MC_RDMA_FAKE_HOST", "hostA", 1);
    setenv("MC_RDMA_FAKE_DEVICES", "dev0,dev1,dev2:down,dev3:switch:nogid:max_mr=4096", 1);
    setenv("MC_RDMA_FAKE_RETRY_MS", "300", 1);
    int n = 0;
    list_ = V().get_device_list(&n);
    ASSERT_NE(list_, nullptr);
    ASSERT_EQ(n, 4);
    SetFault(StateDir(), "hostA", "dev0", "");
    SetFault(StateDir(), "hostA", "dev1", "");
  }
  void TearDown() override {
    a_.Close();
    b_.Close();
    V().free_device_list(list_);
  }
  // a (dev0) and b (dev1) connected both ways; b's MR grants `b_access`.
  void Connect(int b_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) {
    a_.Open(list_[0], IBV_ACCESS_LOCAL_WRITE);
    b_.Open(list_[1], b_access);
    ASSERT_EQ(a_.ToInit(), 0);
    ASSERT_EQ(b_.ToInit(), 0);
    ASSERT_EQ(b_.ToRtr(a_.qp->qp_num, a_.Gid()), 0);
    ASSERT_EQ(b_.ToRts(), 0);
    ASSERT_EQ(a_.ToRtr(b_.qp->qp_num, b_.Gid()), 0);
    ASSERT_EQ(a_.ToRts(), 0);
  }
  uint64_t BAddr(uint64_t off = 0) { return reinterpret_cast<uint64_t>(b_.mem.data()) + off; }

  ibv_device** list_ = nullptr;
  Side a_, b_;
};

TEST_F(FakeVerbsTest, DevicesPortsAndGids) {
  ibv_context* c = V().open_device(list_[0]);
  ASSERT_NE(c, nullptr);
  ibv_port_attr port;
  ASSERT_EQ(V().query_port(c, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_NE(V().query_port(c, 2, &port), 0);
  ibv_gid_entry e;
  ASSERT_EQ(V().query_gid_ex(c, 1, 2, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e.gid.raw[10], 0xff);  // IPv4-mapped
  EXPECT_EQ(e.gid.raw[11], 0xff);
  EXPECT_EQ(V().query_gid_ex(c, 1, 3, &e, 0), ENODATA);
  EXPECT_EQ(V().close_device(c), 0);

  c = V().open_device(list_[2]);
  ASSERT_EQ(V().query_port(c, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  V().close_device(c);
  EXPECT_EQ(list_[3]->node_type, IBV_NODE_SWITCH);
  c = V().open_device(list_[3]);
  ibv_device_attr attr;
  ASSERT_EQ(V().query_device(c, &attr), 0);
  EXPECT_EQ(attr.max_mr_size, 4096u);
  EXPECT_EQ(V().query_gid_ex(c, 1, 0, &e, 0), ENODATA);
  V().close_device(c);
}

TEST_F(FakeVerbsTest, QpStateMachineChecksTransitionsAndAttributes) {
  a_.Open(list_[0], IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, 0x1000, 1, 8), EINVAL) << "posting in RESET";
  EXPECT_EQ(a_.ToRtr(0x123, a_.Gid()), EINVAL) << "RESET -> RTR";
  ibv_qp_attr bad{};
  bad.qp_state = IBV_QPS_INIT;
  bad.port_num = 1;
  EXPECT_EQ(V().modify_qp(a_.qp, &bad, IBV_QP_STATE | IBV_QP_PORT), EINVAL) << "INIT without pkey/access";
  bad.port_num = 2;
  EXPECT_EQ(V().modify_qp(a_.qp, &bad, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL)
      << "no port 2";
  ASSERT_EQ(a_.ToInit(), 0);
  EXPECT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, 0x1000, 1, 8), EINVAL) << "posting in INIT";
  EXPECT_EQ(a_.ToRts(), EINVAL) << "INIT -> RTS";
  EXPECT_EQ(a_.ToRtr(0x123, a_.Gid(), static_cast<ibv_mtu>(IBV_MTU_4096 + 1)), EINVAL) << "MTU above the port's";
  ASSERT_EQ(a_.ToRtr(0x123, a_.Gid()), 0);
  ASSERT_EQ(a_.ToRts(), 0);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(V().modify_qp(a_.qp, &err, IBV_QP_STATE), 0);
  // In ERR, WRs are accepted and flushed.
  EXPECT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, 0x1000, 1, 8, 42), 0);
  ibv_wc wc = a_.Wait();
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc.wr_id, 42u);
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(V().modify_qp(a_.qp, &reset, IBV_QP_STATE), 0);
  EXPECT_EQ(a_.ToInit(), 0);
}

TEST_F(FakeVerbsTest, WriteAndReadMoveTheBytesAndSignalTheChannel) {
  Connect();
  for (size_t i = 0; i < 4096; ++i) a_.mem[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(100), b_.mr->rkey, 4096, 7), 0);
  ibv_wc wc = a_.Wait();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << V().wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc.qp_num, a_.qp->qp_num);
  EXPECT_EQ(memcmp(a_.mem.data(), b_.mem.data() + 100, 4096), 0);
  for (size_t i = 0; i < 512; ++i) b_.mem[9000 + i] = static_cast<uint8_t>(i ^ 0x5a);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_READ, 8192, BAddr(9000), b_.mr->rkey, 512, 8), 0);
  wc = a_.Wait();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc.byte_len, 512u);
  EXPECT_EQ(memcmp(a_.mem.data() + 8192, b_.mem.data() + 9000, 512), 0);
}

TEST_F(FakeVerbsTest, BoundedOutstandingWorkRequests) {
  Connect();
  // The QP was created with max_send_wr = 16: the 17th WR in flight is refused (ENOMEM) unless some finished.
  SetFault(StateDir(), "hostA", "dev1", "port_down");  // keep them in flight (retrying)
  int refused = 0;
  for (int i = 0; i < 17; ++i) refused += a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64, i) == ENOMEM;
  EXPECT_EQ(refused, 1);
  SetFault(StateDir(), "hostA", "dev1", "");
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a_.Wait().status, IBV_WC_SUCCESS);
}

TEST_F(FakeVerbsTest, RemoteChecksGiveRemoteAccessErrorAndTheQpFlushes) {
  Connect();
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey ^ 0x100, 64, 1), 0);  // wrong rkey
  EXPECT_EQ(a_.Wait().status, IBV_WC_REM_ACCESS_ERR);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64, 2), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_WR_FLUSH_ERR) << "a QP in ERR flushes";
  EXPECT_EQ(a_.qp->state, IBV_QPS_ERR);
}

TEST_F(FakeVerbsTest, OutOfBoundsIsRemoteAccessError) {
  Connect();
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(b_.mem.size() - 32), b_.mr->rkey, 64), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(b_.mem[b_.mem.size() - 1], 0) << "nothing written past the MR";
}

TEST_F(FakeVerbsTest, ReadWithoutRemoteReadAccessIsRefused) {
  Connect(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_READ, 0, BAddr(), b_.mr->rkey, 64), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(FakeVerbsTest, BadLocalKeyIsLocalProtectionError) {
  Connect();
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64, 1, a_.mr->lkey ^ 0x10), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(FakeVerbsTest, PortDownRetriesThenRetryExceeded) {
  Connect();
  SetFault(StateDir(), "hostA", "dev0", "port_down");
  ibv_port_attr port;
  ASSERT_EQ(V().query_port(a_.ctx, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  auto start = Clock::now();
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_RETRY_EXC_ERR);
  auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST_F(FakeVerbsTest, InjectedErrorCompletionsAndQpError) {
  Connect();
  SetFault(StateDir(), "hostA", "dev0", "wc_error=10");  // IBV_WC_REM_ACCESS_ERR... any status number
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64), 0);
  EXPECT_EQ(a_.Wait().status, 10);
  SetFault(StateDir(), "hostA", "dev0", "");
  a_.Close();
  b_.Close();
  Connect();
  SetFault(StateDir(), "hostA", "dev0", "qp_error=5");
  auto until = Clock::now() + std::chrono::seconds(2);
  while (a_.qp->state != IBV_QPS_ERR && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(a_.qp->state, IBV_QPS_ERR);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_WR_FLUSH_ERR);
  SetFault(StateDir(), "hostA", "dev0", "");
}

TEST_F(FakeVerbsTest, PeerQpGoneRetryExceeded) {
  Connect();
  ASSERT_EQ(V().destroy_qp(b_.qp), 0);
  b_.qp = nullptr;
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), 1, 64), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_RETRY_EXC_ERR);
}

// As on mlx5, an MR's lkey is its rkey: what keeps a peer out of local-only memory is the MR's access flags.
TEST_F(FakeVerbsTest, OneKeyPerMrAndRemoteUseIsCheckedAgainstItsAccessFlags) {
  Connect(/*b_access=*/IBV_ACCESS_LOCAL_WRITE);  // b_'s MR: local use only
  EXPECT_EQ(a_.mr->lkey, a_.mr->rkey);
  EXPECT_EQ(b_.mr->lkey, b_.mr->rkey);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->lkey, 64, 1), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_REM_ACCESS_ERR) << "a local-only MR was written remotely";
  a_.Close();
  b_.Close();
  Connect();  // b_'s MR with remote access: the same kind of key now works, either way round
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->lkey, 64, 1, a_.mr->rkey), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_SUCCESS);
  // A key naming no MR of ours is refused locally.
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64, 2, a_.mr->lkey ^ 0x100), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(FakeVerbsTest, AFullCqOverrunsAndFailsItsQps) {
  a_.Open(list_[0], IBV_ACCESS_LOCAL_WRITE, /*cqe=*/4);
  b_.Open(list_[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(a_.ToInit(), 0);
  ASSERT_EQ(b_.ToInit(), 0);
  ASSERT_EQ(b_.ToRtr(a_.qp->qp_num, a_.Gid()), 0);
  ASSERT_EQ(b_.ToRts(), 0);
  ASSERT_EQ(a_.ToRtr(b_.qp->qp_num, b_.Gid()), 0);
  ASSERT_EQ(a_.ToRts(), 0);
  for (int i = 0; i < 6; ++i) ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64, i), 0);
  ibv_wc wc[8];
  auto until = Clock::now() + std::chrono::seconds(3);
  while (a_.qp->state != IBV_QPS_ERR && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(a_.qp->state, IBV_QPS_ERR) << "the QP of an overrun CQ is in error";
  EXPECT_LT(V().poll_cq(a_.cq, 8, wc), 0) << "an overrun CQ fails every poll";
}

TEST_F(FakeVerbsTest, PsnsAndMtusOfBothQpsMustAgree) {
  // b expects PSN 5, a starts at 0: out of sequence until the retries run out.
  a_.Open(list_[0], IBV_ACCESS_LOCAL_WRITE);
  b_.Open(list_[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(a_.ToInit(), 0);
  ASSERT_EQ(b_.ToInit(), 0);
  ASSERT_EQ(b_.ToRtr(a_.qp->qp_num, a_.Gid(), IBV_MTU_1024, /*rq_psn=*/5), 0);
  ASSERT_EQ(b_.ToRts(), 0);
  ASSERT_EQ(a_.ToRtr(b_.qp->qp_num, b_.Gid()), 0);
  ASSERT_EQ(a_.ToRts(/*sq_psn=*/0), 0);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 64, 1), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(b_.mem[0], 0);
  a_.Close();
  b_.Close();
  // Matching PSNs (7 each way is fine too) but path MTUs 1024 and 512: a 4 KiB write is an invalid request to
  // the responder, while one packet's worth (256 bytes) passes.
  a_.Open(list_[0], IBV_ACCESS_LOCAL_WRITE);
  b_.Open(list_[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(a_.ToInit(), 0);
  ASSERT_EQ(b_.ToInit(), 0);
  ASSERT_EQ(b_.ToRtr(a_.qp->qp_num, a_.Gid(), IBV_MTU_512, 7), 0);
  ASSERT_EQ(b_.ToRts(9), 0);
  ASSERT_EQ(a_.ToRtr(b_.qp->qp_num, b_.Gid(), IBV_MTU_1024, 9), 0);
  ASSERT_EQ(a_.ToRts(7), 0);
  a_.mem[0] = 0x42;
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 256, 1), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_SUCCESS);
  EXPECT_EQ(b_.mem[0], 0x42);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, BAddr(), b_.mr->rkey, 4096, 2), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(FakeVerbsTest, DmabufMrsCheckTheirArgumentsAndCarryBytes) {
  ASSERT_NE(V().reg_dmabuf_mr, nullptr);
  Connect();
  constexpr size_t kLen = 1 << 16;
  int fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 2 * kLen), 0);
  void* map = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, kLen);  // file offset kLen
  ASSERT_NE(map, MAP_FAILED);
  const uint64_t iova = reinterpret_cast<uint64_t>(map);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  errno = 0;
  EXPECT_EQ(V().reg_dmabuf_mr(b_.pd, kLen, kLen, iova, -1, access), nullptr);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(V().reg_dmabuf_mr(b_.pd, kLen, 0, iova, fd, access), nullptr) << "zero length";
  EXPECT_EQ(V().reg_dmabuf_mr(b_.pd, kLen + 4096, kLen, iova, fd, access), nullptr) << "beyond the buffer";
  EXPECT_EQ(V().reg_dmabuf_mr(b_.pd, 0, kLen, iova, fd, access), nullptr) << "iova maps another offset";
  EXPECT_EQ(V().reg_dmabuf_mr(b_.pd, kLen, kLen, 0, fd, access), nullptr) << "null iova";
  EXPECT_EQ(V().reg_dmabuf_mr(b_.pd, kLen, kLen, iova, fd, IBV_ACCESS_REMOTE_WRITE), nullptr)
      << "remote write without local write";
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* mr = V().reg_dmabuf_mr(b_.pd, kLen, kLen, iova, fd, access);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(mr->lkey, mr->rkey);
  for (int i = 0; i < 1000; ++i) a_.mem[i] = static_cast<uint8_t>(i * 5);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, iova + 100, mr->rkey, 1000, 1), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_SUCCESS);
  std::vector<uint8_t> back(1000);
  ASSERT_EQ(pread(fd, back.data(), back.size(), kLen + 100), 1000);  // landed in the dma-buf's pages
  EXPECT_EQ(memcmp(back.data(), a_.mem.data(), 1000), 0);
  EXPECT_EQ(V().dereg_mr(mr), 0);
  munmap(map, kLen);
  close(fd);
}

// The responder is another process: its memory is written through process_vm_writev.
TEST_F(FakeVerbsTest, AcrossProcesses) {
  a_.Open(list_[0], IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(a_.ToInit(), 0);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Side b;
    b.Open(list_[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    uint32_t a_qpn = 0;
    if (read(to_child[0], &a_qpn, 4) != 4) _exit(2);
    if (b.ToInit() || b.ToRtr(a_qpn, a_.Gid()) || b.ToRts()) _exit(3);
    struct {
      uint32_t qpn, rkey;
      uint64_t addr;
      ibv_gid gid;
    } info{b.qp->qp_num, b.mr->rkey, reinterpret_cast<uint64_t>(b.mem.data()), b.Gid()};
    if (write(to_parent[1], &info, sizeof(info)) != sizeof(info)) _exit(4);
    char done;
    if (read(to_child[0], &done, 1) != 1) _exit(5);
    bool ok = true;
    for (int i = 0; i < 1000; ++i) ok = ok && b.mem[i] == static_cast<uint8_t>(i * 3);
    _exit(ok ? 0 : 6);
  }
  uint32_t qpn = a_.qp->qp_num;
  ASSERT_EQ(write(to_child[1], &qpn, 4), 4);
  struct {
    uint32_t qpn, rkey;
    uint64_t addr;
    ibv_gid gid;
  } info;
  ASSERT_EQ(read(to_parent[0], &info, sizeof(info)), static_cast<ssize_t>(sizeof(info)));
  ASSERT_EQ(a_.ToRtr(info.qpn, info.gid), 0);
  ASSERT_EQ(a_.ToRts(), 0);
  for (int i = 0; i < 1000; ++i) a_.mem[i] = static_cast<uint8_t>(i * 3);
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, info.addr, info.rkey, 1000), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_SUCCESS);
  ASSERT_EQ(write(to_child[1], "d", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // The child is gone: its QP record remains but its process does not.
  ASSERT_EQ(a_.Post(IBV_WR_RDMA_WRITE, 0, info.addr, info.rkey, 1000), 0);
  EXPECT_EQ(a_.Wait().status, IBV_WC_RETRY_EXC_ERR);
}

}  // namespace
}  // namespace mooncake::te::rdma::fake
