#include "transfer_engine/transport/rdma/testing/fake_verbs.h"

#include "transfer_engine/transport/rdma/testing/fake_internal.h"

namespace mooncake::te::rdma::fake {

namespace {

using namespace internal;  // NOLINT: this file implements the internals' entry points

FakeContext* Ctx(ibv_context* c) { return reinterpret_cast<FakeContext*>(c); }
FakeQp* Qp(ibv_qp* q) { return reinterpret_cast<FakeQp*>(q); }
FakeCq* Cq(ibv_cq* c) { return reinterpret_cast<FakeCq*>(c); }

// ---------------------------------------------------------------- the verbs

int FakePostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  FakeQp* q = Qp(qp);
  FakeContext* c = q->fctx;
  std::lock_guard lock(c->mu);
  for (ibv_send_wr* w = wr; w; w = w->next) {
    int err = 0;
    if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR && q->state != IBV_QPS_SQD) err = EINVAL;
    else if (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_READ) err = EINVAL;
    else if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > q->max_sge) err = EINVAL;
    else if (q->outstanding >= q->max_send_wr) err = ENOMEM;
    if (err) {
      if (bad) *bad = w;
      return err;
    }
    Work work;
    work.qp = q;
    work.wr_id = w->wr_id;
    work.opcode = w->opcode;
    work.signaled = q->sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED);
    work.remote_addr = w->wr.rdma.remote_addr;
    work.rkey = w->wr.rdma.rkey;
    work.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    q->outstanding++;
    c->queue.push_back(std::move(work));
  }
  c->cv.notify_all();
  return 0;
}

int FakePostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  FakeQp* q = Qp(qp);
  std::lock_guard lock(q->fctx->mu);
  if (q->state == IBV_QPS_RESET) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  return 0;  // receive WQEs are accepted and never consumed (no SEND or immediate data in the fake)
}

int FakePollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  FakeCq* c = Cq(cq);
  std::lock_guard lock(c->mu);
  if (c->overrun) return -EOVERFLOW;  // a CQ in error (overrun) fails every poll
  int got = 0;
  while (got < n && !c->wcs.empty()) {
    wc[got++] = c->wcs.front();
    c->wcs.pop_front();
  }
  return got;
}

int FakeReqNotifyCq(ibv_cq* cq, int) {
  FakeCq* c = Cq(cq);
  std::lock_guard lock(c->mu);
  c->armed = true;
  return 0;
}

ibv_device** FakeGetDeviceList(int* num) {
  Provider& p = Provider::Get();
  if (!p.Init()) {
    errno = ENOSYS;  // what libibverbs says on a host without RDMA support
    if (num) *num = 0;
    return nullptr;
  }
  std::vector<FakeDevice*> devs = p.devices();
  auto** list = static_cast<ibv_device**>(calloc(devs.size() + 1, sizeof(ibv_device*)));
  for (size_t i = 0; i < devs.size(); ++i) list[i] = &devs[i]->dev;
  if (num) *num = static_cast<int>(devs.size());
  return list;
}

void FakeFreeDeviceList(ibv_device** list) { free(list); }

const char* FakeGetDeviceName(ibv_device* d) { return d->name; }

ibv_context* FakeOpenDevice(ibv_device* d) {
  auto* c = new FakeContext();
  memset(&c->ctx, 0, sizeof(c->ctx));
  c->dev = reinterpret_cast<FakeDevice*>(d);
  c->ctx.device = d;
  c->ctx.cmd_fd = -1;
  c->ctx.async_fd = -1;
  c->ctx.num_comp_vectors = 1;
  c->ctx.ops.post_send = FakePostSend;
  c->ctx.ops.post_recv = FakePostRecv;
  c->ctx.ops.poll_cq = FakePollCq;
  c->ctx.ops.req_notify_cq = FakeReqNotifyCq;
  pthread_mutex_init(&c->ctx.mutex, nullptr);
  // A qp_error fault present before the device was opened is history, not news.
  c->qp_error_applied =
      ReadFaults(Provider::Get().cfg().state, Provider::Get().cfg().host, c->dev->spec.name).qp_error;
  c->worker = std::thread(WorkerLoop, c);
  return &c->ctx;
}

int FakeCloseDevice(ibv_context* ctx) {
  FakeContext* c = Ctx(ctx);
  {
    std::lock_guard lock(c->mu);
    if (!c->qps.empty()) return EBUSY;
    c->stop = true;
  }
  c->cv.notify_all();
  c->worker.join();
  delete c;
  return 0;
}

int FakeQueryDevice(ibv_context* ctx, ibv_device_attr* a) {
  memset(a, 0, sizeof(*a));
  const FakeDevice* d = Ctx(ctx)->dev;
  snprintf(a->fw_ver, sizeof(a->fw_ver), "fake-1.0");
  a->max_mr_size = d->spec.max_mr;
  a->page_size_cap = 4096;
  a->max_qp = 1 << 16;
  a->max_qp_wr = 8192;
  a->max_sge = 16;
  a->max_cq = 1 << 14;
  a->max_cqe = 1 << 20;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->phys_port_cnt = 1;
  a->max_pkeys = 1;
  a->node_guid = Hash(Provider::Get().cfg().host + "/" + d->spec.name);
  return 0;
}

int FakeQueryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* a) {
  if (port != 1) return EINVAL;
  memset(a, 0, sizeof(*a));
  const FakeDevice* d = Ctx(ctx)->dev;
  const bool active = PortActive(d, Provider::Get().cfg().host);
  a->state = active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = d->spec.netdev.empty() ? IBV_MTU_4096 : MtuFor(NetdevMtu(d->spec.netdev));
  a->gid_tbl_len = kGidTableLen;
  a->pkey_tbl_len = 1;
  a->max_msg_sz = 1U << 31;
  a->link_layer = d->spec.ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
  a->lid = d->spec.ib ? static_cast<uint16_t>((Hash(Provider::Get().cfg().host + d->spec.name) % 0xbfff) + 1) : 0;
  a->active_width = 2;
  a->active_speed = 32;
  a->phys_state = active ? 5 : 3;
  return 0;
}

int FakeQueryGidEx(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* e, uint32_t) {
  if (port != 1 || index >= kGidTableLen) return EINVAL;
  memset(e, 0, sizeof(*e));
  ibv_gid_type type;
  GidEntry(Ctx(ctx)->dev, index, &e->gid, &type);
  if (GidHex(e->gid) == std::string(32, '0')) return ENODATA;
  e->gid_index = index;
  e->port_num = port;
  e->gid_type = type;
  return 0;
}

int FakeQueryGid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index < 0 || index >= kGidTableLen) return -1;
  ibv_gid_type type;
  GidEntry(Ctx(ctx)->dev, static_cast<uint32_t>(index), gid, &type);
  return 0;
}

ibv_pd* FakeAllocPd(ibv_context* ctx) {
  auto* p = new FakePd();
  memset(&p->pd, 0, sizeof(p->pd));
  p->pd.context = ctx;
  p->id = Provider::Get().NextPdId();
  p->pd.handle = p->id;
  return &p->pd;
}

int FakeDeallocPd(ibv_pd* pd) {
  delete reinterpret_cast<FakePd*>(pd);
  return 0;
}

ibv_mr* FakeRegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  const FakeContext* c = Ctx(pd->context);
  if (length == 0 || length > c->dev->spec.max_mr || addr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  // Remote write access needs local write access (as the verbs specification requires).
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* m = new FakeMr();
  memset(&m->mr, 0, sizeof(m->mr));
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->access = access;
  m->pd_id = reinterpret_cast<FakePd*>(pd)->id;
  Provider::Get().AddMr(m);
  m->mr.handle = m->mr.lkey;
  return &m->mr;
}

// Whether this process maps [iova, iova + length) from the file `st` names at file offset `offset`, in one
// mapping (/proc/self/maps). The fake moves bytes with process_vm_writev/readv at the MR's addresses, so a
// dma-buf MR is usable only where the buffer is mapped at its iova (a real HCA reaches the pages without a
// mapping).
bool MappedAt(const struct stat& st, uint64_t offset, size_t length, uint64_t iova) {
  FILE* maps = fopen("/proc/self/maps", "re");
  if (!maps) return false;
  char line[512];
  bool ok = false;
  while (!ok && fgets(line, sizeof(line), maps)) {
    unsigned long long start, end, file_off, inode;
    unsigned major, minor;
    char perms[8];
    if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &file_off, &major, &minor, &inode) != 7) {
      continue;
    }
    if (inode != st.st_ino || iova < start || iova >= end || length > end - iova) continue;
    ok = file_off + (iova - start) == offset;
  }
  fclose(maps);
  return ok;
}

// ibv_reg_dmabuf_mr: `fd` is the exporter's dma-buf (here: a file, e.g. the host emulation's memfd), `offset`
// the buffer's start in it, `iova` the address work requests use for it. EOPNOTSUPP when MC_RDMA_FAKE_DMABUF=0
// (a provider without dma-buf support); EINVAL for a zero or oversized length, a null iova, bad access flags,
// a range beyond the file, or (the fake's limit) an iova where this process does not map the file at `offset`;
// EBADF for an fd that is not open.
ibv_mr* FakeRegDmabufMr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
  const FakeContext* c = Ctx(pd->context);
  if (!Provider::Get().cfg().dmabuf) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    errno = EBADF;
    return nullptr;
  }
  if (length == 0 || length > c->dev->spec.max_mr || iova == 0 || !S_ISREG(st.st_mode) ||
      offset > static_cast<uint64_t>(st.st_size) || length > static_cast<uint64_t>(st.st_size) - offset ||
      ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      !MappedAt(st, offset, length, iova)) {
    errno = EINVAL;
    return nullptr;
  }
  return FakeRegMr(pd, reinterpret_cast<void*>(iova), length, access);
}

int FakePeerMemory() { return Provider::Get().Init() && Provider::Get().cfg().peermem ? 1 : 0; }

int FakeDeregMr(ibv_mr* mr) {
  auto* m = reinterpret_cast<FakeMr*>(mr);
  Provider::Get().RemoveMr(m);
  delete m;
  return 0;
}

ibv_comp_channel* FakeCreateCompChannel(ibv_context* ctx) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
  auto* ch = new FakeChannel();
  memset(&ch->ch, 0, sizeof(ch->ch));
  ch->ch.context = ctx;
  ch->ch.fd = fds[0];
  ch->write_fd = fds[1];
  return &ch->ch;
}

int FakeDestroyCompChannel(ibv_comp_channel* channel) {
  auto* ch = reinterpret_cast<FakeChannel*>(channel);
  close(ch->ch.fd);
  close(ch->write_fd);
  delete ch;
  return 0;
}

ibv_cq* FakeCreateCq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  if (cqe <= 0 || cqe > (1 << 20)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* c = new FakeCq();
  memset(&c->cq, 0, sizeof(c->cq));
  c->cq.context = ctx;
  c->cq.channel = channel;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  c->capacity = static_cast<size_t>(cqe);
  c->channel = reinterpret_cast<FakeChannel*>(channel);
  return &c->cq;
}

int FakeDestroyCq(ibv_cq* cq) {
  delete Cq(cq);
  return 0;
}

int FakeGetCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  auto* ch = reinterpret_cast<FakeChannel*>(channel);
  char c;
  ssize_t n;
  while ((n = read(ch->ch.fd, &c, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) return -1;
  std::lock_guard lock(ch->mu);
  if (ch->events.empty()) return -1;
  FakeCq* f = ch->events.front();
  ch->events.pop_front();
  *cq = &f->cq;
  *cq_context = f->cq.cq_context;
  return 0;
}

void FakeAckCqEvents(ibv_cq*, unsigned int) {}

ibv_qp* FakeCreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (attr->qp_type != IBV_QPT_RC || attr->send_cq == nullptr || attr->recv_cq == nullptr ||
      attr->cap.max_send_wr == 0 || attr->cap.max_send_wr > 8192 || attr->cap.max_send_sge > 16) {
    errno = EINVAL;
    return nullptr;
  }
  FakeContext* c = Ctx(pd->context);
  auto* q = new FakeQp();
  memset(&q->qp, 0, sizeof(q->qp));
  q->fctx = c;
  q->pd = reinterpret_cast<FakePd*>(pd);
  q->send_cq = Cq(attr->send_cq);
  q->max_send_wr = attr->cap.max_send_wr;
  q->max_sge = std::max<uint32_t>(1, attr->cap.max_send_sge);
  q->sq_sig_all = attr->sq_sig_all != 0;
  q->qp.context = pd->context;
  q->qp.qp_context = attr->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.state = IBV_QPS_RESET;
  // A QP number no other QP of the state directory has (the record file is created exclusively).
  Provider& p = Provider::Get();
  for (int tries = 0;; ++tries) {
    uint32_t qpn = (p.Random32() & 0xffffff) | 0x100;
    int fd = open(QpPath(qpn).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      close(fd);
      q->qp.qp_num = qpn;
      break;
    }
    if (errno != EEXIST || tries > 1000) {
      delete q;
      errno = ENOMEM;
      return nullptr;
    }
  }
  std::lock_guard lock(c->mu);
  WriteQpRecord(q);
  c->qps.insert(q);
  return &q->qp;
}

constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC;

int FakeModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  FakeQp* q = Qp(qp);
  FakeContext* c = q->fctx;
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  const ibv_qp_state to = attr->qp_state;
  std::unique_lock lock(c->mu);
  const ibv_qp_state from = q->state;
  if (to == IBV_QPS_ERR) {
    ToErrorLocked(q);
    return 0;
  }
  if (to == IBV_QPS_RESET) {
    // WRs still queued complete with flush errors first (a QP is normally moved to ERR and drained before).
    q->state = IBV_QPS_RESET;
    q->qp.state = IBV_QPS_RESET;
    q->dest_qpn = 0;
    WriteQpRecord(q);
    return 0;
  }
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    if ((mask & kInitMask) != kInitMask || attr->port_num != 1 || attr->pkey_index != 0) return EINVAL;
    q->port = attr->port_num;
    q->access = attr->qp_access_flags;
  } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    if ((mask & kRtrMask) != kRtrMask || attr->dest_qp_num == 0 || attr->dest_qp_num > 0xffffff) return EINVAL;
    ibv_port_attr port;
    FakeQueryPort(&c->ctx, 1, &port);
    if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > port.active_mtu) return EINVAL;
    const ibv_ah_attr& ah = attr->ah_attr;
    if (ah.port_num != 0 && ah.port_num != 1) return EINVAL;
    if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
      if (!ah.is_global || ah.grh.sgid_index >= kGidTableLen) return EINVAL;
      ibv_gid sgid;
      ibv_gid_type type;
      GidEntry(c->dev, ah.grh.sgid_index, &sgid, &type);
      if (GidHex(sgid) == std::string(32, '0')) return EINVAL;
    } else if (!ah.is_global && ah.dlid == 0) {
      return EINVAL;
    }
    q->dest_qpn = attr->dest_qp_num;
    q->mtu = attr->path_mtu;
    q->rq_psn = attr->rq_psn & 0xffffff;
    if (ah.is_global) {
      q->dgid = ah.grh.dgid;
    } else {
      memset(&q->dgid, 0, sizeof(q->dgid));  // IB without GRH: addressed by LID; the peer's GID 0 stands in
    }
  } else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    if ((mask & kRtsMask) != kRtsMask) return EINVAL;
    q->sq_psn = attr->sq_psn & 0xffffff;
  } else {
    return EINVAL;
  }
  q->state = to;
  q->qp.state = to;
  WriteQpRecord(q);
  return 0;
}

int FakeDestroyQp(ibv_qp* qp) {
  FakeQp* q = Qp(qp);
  FakeContext* c = q->fctx;
  {
    std::unique_lock lock(c->mu);
    ToErrorLocked(q);  // a WR being retried stops
    c->cv.wait(lock, [&] { return c->current != q; });
    // No completions after destruction: queued WRs of this QP are dropped.
    c->queue.erase(std::remove_if(c->queue.begin(), c->queue.end(), [&](const Work& w) { return w.qp == q; }),
                   c->queue.end());
    c->qps.erase(q);
  }
  unlink(QpPath(q->qp.qp_num).c_str());
  delete q;
  return 0;
}

const char* FakeWcStatusStr(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_GENERAL_ERR: return "general error";
    default: return "unknown";
  }
}

// The IB link layer fake has no GRH requirement: a WR addressed by LID matches the peer's GID 0 entry.
VerbsApi MakeTable() {
  VerbsApi a;
  a.provider = "fake";
  a.get_device_list = FakeGetDeviceList;
  a.free_device_list = FakeFreeDeviceList;
  a.get_device_name = FakeGetDeviceName;
  a.open_device = FakeOpenDevice;
  a.close_device = FakeCloseDevice;
  a.query_device = FakeQueryDevice;
  a.query_port = FakeQueryPort;
  a.query_gid = FakeQueryGid;
  a.query_gid_ex = FakeQueryGidEx;
  a.alloc_pd = FakeAllocPd;
  a.dealloc_pd = FakeDeallocPd;
  a.reg_mr = FakeRegMr;
  a.dereg_mr = FakeDeregMr;
  a.reg_dmabuf_mr = FakeRegDmabufMr;
  a.peer_memory = FakePeerMemory;
  a.create_comp_channel = FakeCreateCompChannel;
  a.destroy_comp_channel = FakeDestroyCompChannel;
  a.create_cq = FakeCreateCq;
  a.destroy_cq = FakeDestroyCq;
  a.get_cq_event = FakeGetCqEvent;
  a.ack_cq_events = FakeAckCqEvents;
  a.create_qp = FakeCreateQp;
  a.modify_qp = FakeModifyQp;
  a.destroy_qp = FakeDestroyQp;
  a.wc_status_str = FakeWcStatusStr;
  a.post_send = FakePostSend;
  a.post_recv = FakePostRecv;
  a.poll_cq = FakePollCq;
  a.req_notify_cq = FakeReqNotifyCq;
  return a;
}

}  // namespace

const VerbsApi* FakeVerbs() {
  static const VerbsApi table = MakeTable();
  return &table;
}

bool SetFault(const std::string& state_dir, const std::string& host, const std::string& device,
              const std::string& faults) {
  mkdir(state_dir.c_str(), 0777);
  mkdir((state_dir + "/fault").c_str(), 0777);
  return WriteFileAtomic(state_dir + "/fault/" + host + "." + device, faults + "\n");
}

unsigned long long ExecutedWorkRequests() { return Provider::Get().executed.load(); }

}  // namespace mooncake::te::rdma::fake
