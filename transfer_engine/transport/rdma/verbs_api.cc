#include "transfer_engine/transport/rdma/verbs_api.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>

namespace mooncake::te::rdma {

namespace {

// libibverbs' _ibv_query_gid_ex takes the entry size as a sixth argument (verbs.h's inline passes it).
using QueryGidExFn = int (*)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);
QueryGidExFn real_query_gid_ex = nullptr;

int QueryGidEx(ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags) {
  return real_query_gid_ex(c, port, index, entry, flags, sizeof(*entry));
}

// The inlines of verbs.h: they call through the context's ops, which the real provider filled.
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return qp->context->ops.post_send(qp, wr, bad); }
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return qp->context->ops.post_recv(qp, wr, bad); }
int PollCq(ibv_cq* cq, int n, ibv_wc* wc) { return cq->context->ops.poll_cq(cq, n, wc); }
int ReqNotifyCq(ibv_cq* cq, int solicited) { return cq->context->ops.req_notify_cq(cq, solicited); }

// Whether the kernel has a peer-memory client, which lets ibv_reg_mr pin GPU memory (GPUDirect RDMA without
// dma-buf).
int PeerMemory() { return PeerMemoryClientLoaded("/sys") ? 1 : 0; }

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out, std::string* why) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    *why = std::string("libibverbs.so.1 has no ") + name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

const VerbsApi* LoadReal(std::string* why) {
  static VerbsApi api;
  // RTLD_LOCAL: another copy of libibverbs in the process (NCCL's) is the same soname and is reused.
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib == nullptr) {
    const char* e = dlerror();
    *why = e != nullptr ? e : "dlopen(libibverbs.so.1) failed";
    return nullptr;
  }
  VerbsApi a;
  a.provider = "libibverbs.so.1";
  bool ok = Resolve(lib, "ibv_get_device_list", &a.get_device_list, why) &&
            Resolve(lib, "ibv_free_device_list", &a.free_device_list, why) &&
            Resolve(lib, "ibv_get_device_name", &a.get_device_name, why) &&
            Resolve(lib, "ibv_open_device", &a.open_device, why) &&
            Resolve(lib, "ibv_close_device", &a.close_device, why) &&
            Resolve(lib, "ibv_query_device", &a.query_device, why) &&
            // The exported ibv_query_port fills the first (compatible) part of ibv_port_attr.
            Resolve(lib, "ibv_query_port", &a.query_port, why) &&
            Resolve(lib, "ibv_query_gid", &a.query_gid, why) &&
            Resolve(lib, "ibv_alloc_pd", &a.alloc_pd, why) && Resolve(lib, "ibv_dealloc_pd", &a.dealloc_pd, why) &&
            Resolve(lib, "ibv_reg_mr", &a.reg_mr, why) && Resolve(lib, "ibv_dereg_mr", &a.dereg_mr, why) &&
            Resolve(lib, "ibv_create_comp_channel", &a.create_comp_channel, why) &&
            Resolve(lib, "ibv_destroy_comp_channel", &a.destroy_comp_channel, why) &&
            Resolve(lib, "ibv_create_cq", &a.create_cq, why) && Resolve(lib, "ibv_destroy_cq", &a.destroy_cq, why) &&
            Resolve(lib, "ibv_get_cq_event", &a.get_cq_event, why) &&
            Resolve(lib, "ibv_ack_cq_events", &a.ack_cq_events, why) &&
            Resolve(lib, "ibv_create_qp", &a.create_qp, why) && Resolve(lib, "ibv_modify_qp", &a.modify_qp, why) &&
            Resolve(lib, "ibv_destroy_qp", &a.destroy_qp, why) &&
            Resolve(lib, "ibv_wc_status_str", &a.wc_status_str, why);
  if (!ok) return nullptr;
  // Optional entry points (newer libibverbs).
  if (void* sym = dlsym(lib, "_ibv_query_gid_ex")) {
    real_query_gid_ex = reinterpret_cast<QueryGidExFn>(sym);
    a.query_gid_ex = QueryGidEx;
  }
  if (void* sym = dlsym(lib, "ibv_reg_dmabuf_mr")) a.reg_dmabuf_mr = reinterpret_cast<decltype(a.reg_dmabuf_mr)>(sym);
  a.peer_memory = PeerMemory;
  a.post_send = PostSend;
  a.post_recv = PostRecv;
  a.poll_cq = PollCq;
  a.req_notify_cq = ReqNotifyCq;
  api = a;
  return &api;
}

const VerbsApi* LoadFake(const std::string& path, std::string* why) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib == nullptr) {
    const char* e = dlerror();
    *why = e != nullptr ? e : "dlopen(" + path + ") failed";
    return nullptr;
  }
  auto entry = reinterpret_cast<FakeVerbsEntry>(dlsym(lib, kFakeVerbsEntry));
  if (entry == nullptr) {
    *why = path + " has no " + kFakeVerbsEntry + " (not a fake verbs provider)";
    return nullptr;
  }
  const VerbsApi* api = entry(sizeof(VerbsApi));
  if (api == nullptr) *why = path + ": the fake verbs provider was built with another VerbsApi";
  if (api != nullptr && api->peer_memory == nullptr) {
    *why = path + ": the fake verbs provider has no peer_memory entry";
    return nullptr;
  }
  return api;
}

}  // namespace

bool PeerMemoryClientLoaded(const std::string& sysfs_root) {
  struct stat st;
  if (stat((sysfs_root + "/module/nvidia_peermem").c_str(), &st) == 0) return true;
  DIR* d = opendir((sysfs_root + "/kernel/mm/memory_peers").c_str());
  if (!d) return false;
  bool client = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') client = true;  // one directory per registered client (e.g. nv_mem)
  }
  closedir(d);
  return client;
}

const VerbsApi* LoadVerbsLibrary(const std::string& path, std::string* why) {
  if (path.empty() || path == "libibverbs.so.1") return LoadReal(why);
  return LoadFake(path, why);
}

const VerbsApi* LoadVerbsApi(std::string* why) {
  static std::once_flag once;
  static const VerbsApi* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const char* fake = getenv("MC_RDMA_FAKE_LIBRARY");
    api = LoadVerbsLibrary(fake != nullptr ? fake : "", &error);
  });
  if (api == nullptr && why != nullptr) *why = error;
  return api;
}

}  // namespace mooncake::te::rdma
