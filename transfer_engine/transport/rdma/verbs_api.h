#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_VERBS_API_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_VERBS_API_H_

// libibverbs, resolved at run time into a function table. The plugin compiles against <infiniband/verbs.h> and
// never links libibverbs: LoadVerbsApi() dlopens libibverbs.so.1 (or, for tests only, the fake provider named by
// MC_RDMA_FAKE_LIBRARY, testing/fake_verbs.h). The data-path calls that verbs.h defines as static inlines
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq dispatch through the context's ops) are entries
// too, so a fake supplies its own. Member names drop the `ibv_` prefix (verbs.h defines ibv_query_port and
// ibv_reg_mr as macros).
//
// This header has no dependency on the engine: the fake provider's shared object includes it.

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake::te::rdma {

/// The verbs entry points the transport uses. Immutable after loading; shared by every transport of the process.
struct VerbsApi {
  size_t struct_size = sizeof(VerbsApi);  ///< checked against the fake's table (same build)
  const char* provider = "";              ///< "libibverbs.so.1", or "fake" for the test provider

  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;
  /// May be null (libibverbs older than v32): GID types are then unknown.
  int (*query_gid_ex)(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  /// May be null (no dma-buf support in this libibverbs).
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access) = nullptr;
  /// 1 when reg_mr accepts device (GPU) memory: a peer-memory client (nvidia_peermem, or the kernel's
  /// memory_peers interface) is loaded. Not a libibverbs call: the real table asks sysfs; a fake answers from
  /// its configuration. Never null once loaded.
  int (*peer_memory)() = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;

  // The static inlines of verbs.h.
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = nullptr;
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc) = nullptr;
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only) = nullptr;

  bool is_fake() const { return std::string(provider) == "fake"; }
};

/// The entry point a fake provider's shared object exports (testing/fake_verbs_so.cc): its table, or null when
/// `struct_size` differs from its own.
using FakeVerbsEntry = const VerbsApi* (*)(size_t struct_size);
constexpr const char* kFakeVerbsEntry = "mc_fake_verbs_api_v1";

/// The process's verbs table: the fake provider when MC_RDMA_FAKE_LIBRARY names one (tests only; logged as a
/// fake), else libibverbs.so.1. Loaded once (never unloaded); null with `*why` set (the dlopen/dlsym text)
/// when it cannot be loaded. Thread-safe.
const VerbsApi* LoadVerbsApi(std::string* why);

/// Whether the sysfs tree at `sysfs_root` ("/sys") shows a loaded peer-memory client: the nvidia_peermem module
/// (module/nvidia_peermem), or a client registered with MLNX_OFED's memory_peers interface (an entry inside
/// kernel/mm/memory_peers: the interface alone, with no client, pins nothing). The real table's peer_memory.
bool PeerMemoryClientLoaded(const std::string& sysfs_root);

/// The table of libibverbs.so.1 or of a fake provider .so at `path`, loaded now (for tests).
const VerbsApi* LoadVerbsLibrary(const std::string& path, std::string* why);

}  // namespace mooncake::te::rdma

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_VERBS_API_H_
