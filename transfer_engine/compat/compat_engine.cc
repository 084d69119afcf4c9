#include "transfer_engine/compat/compat_engine.h"

#include <algorithm>
#include <cstring>

#include "transfer_engine/common/log.h"

namespace mooncake::te {
namespace {

int Fail(const char* what, const Status& st) {
  MC_LOG(kWarning) << what << " failed: " << st.ToString();
  return st.raw_code() < 0 ? st.raw_code() : -1;
}

}  // namespace

CompatEngine::~CompatEngine() = default;

int CompatEngine::Initialize(const std::string& local_hostname, const std::string& metadata_server,
                             const std::string& protocol, const std::string& device_name) {
  return InitializeExt(local_hostname, metadata_server, protocol, device_name, "");
}

int CompatEngine::InitializeExt(const std::string& local_hostname, const std::string& metadata_server,
                                const std::string& protocol, const std::string& device_name,
                                const std::string& metadata_type) {
  if (engine_) {
    MC_LOG(kWarning) << "initialize: this TransferEngine is already initialized as '" << engine_->segment_name()
                     << "'";
    return -1;
  }
  if (protocol == "xgmi") return Fail("initialize", InvalidArgument("protocol 'xgmi' is not supported"));
  EngineOptions options;
  options.local_server_name = local_hostname;
  options.metadata_conn = metadata_server;
  if (!metadata_type.empty() && metadata_server != "P2PHANDSHAKE" &&
      metadata_server.find("://") == std::string::npos) {
    options.metadata_conn = metadata_type + "://" + metadata_server;
  }
  options.protocol = protocol;
  options.device_filter = device_name;
  auto engine = TransferEngine::Create(std::move(options));
  if (!engine.ok()) {
    MC_LOG(kError) << "initialize('" << local_hostname << "', '" << metadata_server
                   << "') failed: " << engine.status().ToString();
    return -1;
  }
  engine_ = std::move(engine.value());
  return 0;
}

int CompatEngine::GetRpcPort() const { return engine_ ? engine_->rpc_port() : -1; }
std::string CompatEngine::SegmentName() const { return engine_ ? engine_->segment_name() : std::string(); }

#define MC_REQUIRE_INIT(ret)                                                        \
  do {                                                                              \
    if (!engine_) {                                                                 \
      MC_LOG(kWarning) << __func__ << ": call initialize() first";                  \
      return ret;                                                                   \
    }                                                                               \
  } while (0)

uintptr_t CompatEngine::AllocateManagedBuffer(size_t length, int device) {
  MC_REQUIRE_INIT(0);
  auto p = engine_->AllocateManaged(length, device);
  if (!p.ok()) {
    Fail("allocate_managed_buffer", p.status());
    return 0;
  }
  return reinterpret_cast<uintptr_t>(*p);
}

int CompatEngine::FreeManagedBuffer(uintptr_t addr, size_t length) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->FreeManaged(reinterpret_cast<void*>(addr), length);
  return st.ok() ? 0 : Fail("free_managed_buffer", st);
}

int CompatEngine::RegisterMemory(uintptr_t addr, size_t length, const std::string& location) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->RegisterMemory(reinterpret_cast<void*>(addr), length, location.empty() ? "*" : location);
  return st.ok() ? 0 : Fail("register_memory", st);
}

int CompatEngine::UnregisterMemory(uintptr_t addr) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->UnregisterMemory(reinterpret_cast<void*>(addr));
  return st.ok() ? 0 : Fail("unregister_memory", st);
}

int CompatEngine::BatchRegisterMemory(const std::vector<uintptr_t>& addrs, const std::vector<size_t>& lengths,
                                      const std::string& location) {
  MC_REQUIRE_INIT(-1);
  if (addrs.size() != lengths.size()) {
    return Fail("batch_register_memory", InvalidArgument("addresses and capacities differ in length"));
  }
  for (size_t i = 0; i < addrs.size(); ++i) {
    int rc = RegisterMemory(addrs[i], lengths[i], location);
    if (rc != 0) {
      for (size_t j = 0; j < i; ++j) UnregisterMemory(addrs[j]);  // all or nothing
      return rc;
    }
  }
  return 0;
}

int CompatEngine::BatchUnregisterMemory(const std::vector<uintptr_t>& addrs) {
  MC_REQUIRE_INIT(-1);
  int rc = 0;
  for (uintptr_t a : addrs) {
    int r = UnregisterMemory(a);
    if (r != 0 && rc == 0) rc = r;
  }
  return rc;
}

std::chrono::nanoseconds CompatEngine::Budget(size_t bytes) const {
  return engine_->config().transfer_timeout + std::chrono::nanoseconds(bytes);
}

bool CompatEngine::BuildRequests(const std::string& target, const std::vector<uintptr_t>& buffers,
                                 const std::vector<uint64_t>& peer_addresses, const std::vector<size_t>& lengths,
                                 OpCode op, std::vector<TransferRequest>* out, size_t* total) {
  if (buffers.size() != peer_addresses.size() || buffers.size() != lengths.size()) {
    Fail("transfer", InvalidArgument("buffers, peer_buffer_addresses and lengths differ in length"));
    return false;
  }
  auto handle = engine_->OpenSegment(target);
  if (!handle.ok()) {
    Fail("transfer", handle.status());
    return false;
  }
  *total = 0;
  out->clear();
  for (size_t i = 0; i < buffers.size(); ++i) {
    TransferRequest r;
    r.opcode = op;
    r.source = reinterpret_cast<void*>(buffers[i]);
    r.target = *handle;
    r.target_address = peer_addresses[i];
    r.length = lengths[i];
    *total += lengths[i];
    out->push_back(r);
  }
  return true;
}

int CompatEngine::RunSync(const std::string& target, const std::vector<TransferRequest>& requests, size_t total,
                          const std::optional<Notification>& notify) {
  // The engine itself moves a slice again after a descriptor refresh when the peer restarted (SliceRetry).
  Status st = engine_->TransferSync(requests, Budget(total), notify ? &*notify : nullptr);
  if (st.ok()) return 0;
  engine_->InvalidateSegment(target);  // the next call starts from fresh metadata and connections
  return Fail("transfer", st);
}

int CompatEngine::TransferSync(const std::string& target, uintptr_t buffer, uint64_t peer_address, size_t length,
                               OpCode op, const std::optional<Notification>& notify) {
  return BatchTransferSync(target, {buffer}, {peer_address}, {length}, op, notify);
}

int CompatEngine::BatchTransferSync(const std::string& target, const std::vector<uintptr_t>& buffers,
                                    const std::vector<uint64_t>& peer_addresses, const std::vector<size_t>& lengths,
                                    OpCode op, const std::optional<Notification>& notify) {
  MC_REQUIRE_INIT(-1);
  std::vector<TransferRequest> requests;
  size_t total = 0;
  if (!BuildRequests(target, buffers, peer_addresses, lengths, op, &requests, &total)) return -1;
  return RunSync(target, requests, total, notify);
}

uint64_t CompatEngine::BatchTransferAsync(const std::string& target, const std::vector<uintptr_t>& buffers,
                                          const std::vector<uint64_t>& peer_addresses,
                                          const std::vector<size_t>& lengths, OpCode op) {
  MC_REQUIRE_INIT(0);
  std::vector<TransferRequest> requests;
  size_t total = 0;
  if (!BuildRequests(target, buffers, peer_addresses, lengths, op, &requests, &total)) return 0;
  auto batch = engine_->AllocateBatch(requests.empty() ? 1 : requests.size());
  if (!batch.ok()) {
    Fail("batch_transfer_async", batch.status());
    return 0;
  }
  Status st = engine_->Submit(*batch, requests);
  if (!st.ok()) {
    Status released = engine_->ReleaseBatch(*batch);
    (void)released;
    Fail("batch_transfer_async", st);
    return 0;
  }
  return *batch;
}

int CompatEngine::GetBatchTransferStatus(const std::vector<uint64_t>& batch_ids) {
  MC_REQUIRE_INIT(-1);
  int rc = 0;
  for (uint64_t id : batch_ids) {
    auto status = engine_->WaitBatch(id, Budget(0));
    if (!status.ok()) {
      rc = Fail("get_batch_transfer_status", status.status());
      continue;
    }
    if (status->state != TransferState::kCompleted) {
      Status e = engine_->GetTaskError(id, 0);
      MC_LOG(kWarning) << "batch " << id << " " << TransferStateName(status->state)
                       << (e.ok() ? std::string() : ": " + e.message());
      rc = -1;
    }
    Status released = engine_->ReleaseBatch(id);
    (void)released;
  }
  return rc;
}

int CompatEngine::TransferCheckStatus(uint64_t batch_id) {
  MC_REQUIRE_INIT(-1);
  auto status = engine_->GetBatchStatus(batch_id);
  if (!status.ok()) return Fail("transfer_check_status", status.status());
  switch (status->state) {
    case TransferState::kCompleted:
      (void)engine_->ReleaseBatch(batch_id);
      return 1;
    case TransferState::kTimeout:
      (void)engine_->ReleaseBatch(batch_id);
      return -2;
    case TransferState::kFailed:
    case TransferState::kCanceled:
    case TransferState::kInvalid:
      (void)engine_->ReleaseBatch(batch_id);
      return -1;
    default:
      return 0;
  }
}

uintptr_t CompatEngine::GetFirstBufferAddress(const std::string& segment_name) {
  MC_REQUIRE_INIT(0);
  auto buffers = engine_->GetSegmentBuffers(segment_name);
  if (!buffers.ok()) {
    Fail("get_first_buffer_address", buffers.status());
    return 0;
  }
  return buffers->empty() ? 0 : static_cast<uintptr_t>(buffers->front().addr);
}

int CompatEngine::DefineSegment(const std::string& name, const std::string& descriptor_json) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->DefineSegment(name, descriptor_json);
  return st.ok() ? 0 : Fail("define_segment", st);
}

int CompatEngine::UndefineSegment(const std::string& name) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->UndefineSegment(name);
  return st.ok() ? 0 : Fail("undefine_segment", st);
}

std::string CompatEngine::GetLocalTopology(const std::string& device_name) const {
  return TransferEngine::LocalTopologyJson(device_name);
}

std::vector<Notification> CompatEngine::GetNotifies() {
  MC_REQUIRE_INIT({});
  return engine_->TakeNotifications();
}

int CompatEngine::SendProbe(const std::string& peer, int timeout_ms) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->Probe(peer, std::chrono::milliseconds(std::max(0, timeout_ms)));
  return st.ok() ? 0 : Fail("send_probe", st);
}

int CompatEngine::SendNotify(const std::string& peer, const Notification& notify) {
  MC_REQUIRE_INIT(-1);
  Status st = engine_->SendNotify(peer, notify);
  return st.ok() ? 0 : Fail("send_notify", st);
}

std::string CompatEngine::StatsJson() const { return engine_ ? engine_->StatsJson() : "{}"; }

}  // namespace mooncake::te
