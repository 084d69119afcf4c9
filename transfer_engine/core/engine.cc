#include "transfer_engine/api/engine.h"
#include "transfer_engine/core/engine_impl.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"
#include "transfer_engine/common/process_watch.h"
#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/core/batch.h"
#include "transfer_engine/core/handshake_methods.h"
#include "transfer_engine/core/managed_memory.h"
#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/core/notification_queue.h"
#include "transfer_engine/core/rpc.h"
#include "transfer_engine/core/segment_descriptor.h"
#include "transfer_engine/core/slice_retry.h"
#include "transfer_engine/core/topology.h"
#include "transfer_engine/core/transport_set.h"
#include "transfer_engine/plugin/loader.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te {
namespace {

// The kind of a peer's buffer, from its location ("cuda:0", "cpu:1", "*"); host when it names none.
MemoryKind RemoteKind(const BufferDescriptor& b) {
  auto kind = MemoryKind::Parse(b.name);
  return kind.ok() ? *kind : MemoryKind{};
}

}  // namespace


// ---------------------------------------------------------------------------------------------------------
// Initialisation

Status TransferEngine::Impl::OwnerGone(const net::HostPort& owner) const {
  // Asks whatever listens there for its descriptor. Proof that the holder of our name is gone:
  // - the connection is refused, and the owner's address is certainly this host (loopback, or an address of
  //   one of our interfaces: net::IsThisHost): nothing listens there. A refusal from another host proves
  //   nothing (a firewall REJECT rule answers the same way in front of a live engine): the name stays
  //   blocked until the entry's lease/TTL lapses (etcd, Redis), or someone removes it (HTTP);
  // - an engine of another name answers there (the port was reused);
  // - we answer there ourselves (a stale entry with another address of this host and our port).
  // A timeout or any other failure proves nothing (the holder may be stopped or overloaded).
  RpcFrame f;
  f.type = RpcType::kMetadata;
  f.body = "{}";
  bool refused = false;
  auto reply = RpcCall(owner.host, owner.port, f, config_.handshake_connect_timeout, config_.handshake_max_length,
                       &refused);
  std::string holder = "segment name '" + segment_name_ + "' is held by the engine at " + owner.ToString();
  if (!reply.ok()) {
    if (refused && net::IsThisHost(owner.host)) return Status::Ok();
    std::string why = refused ? "it refused the connection, but it is not an address of this host, so a "
                                "firewall may stand in front of a live engine"
                              : reply.status().message();
    return Status(ErrorCode::kMetadata, holder + ", which may still be alive (" + why +
                                            "); not taking the name over (stop that engine, wait for its "
                                            "metadata entry to expire, or use another name)");
  }
  auto desc = SegmentDescriptor::Parse(reply->body);
  if (desc.ok() && desc->name != segment_name_) return Status::Ok();
  if (desc.ok() && desc->json.is_object() && desc->json.contains("instance") && desc->json["instance"].is_string() &&
      desc->json["instance"].get<std::string>() == instance_) {
    return Status::Ok();
  }
  return Status(ErrorCode::kMetadata,
                holder + (desc.ok() ? ", which is alive (it answered); use another local_hostname"
                                    : ", which answered something that is not a descriptor; not taking the name over"));
}

Status TransferEngine::Impl::Init() {
  if (options_.local_server_name.empty()) return InvalidArgument("local_hostname must not be empty");
  {
    std::random_device rd;
    std::ostringstream id;
    id << std::hex << ((static_cast<uint64_t>(rd()) << 32) | rd());
    instance_ = id.str();
  }
  auto local = net::ParseHostPort(options_.local_server_name);
  if (!local.ok()) return local.status();

  auto metadata = CreateMetadataBackend(options_.metadata_conn, config_);
  if (!metadata.ok()) return metadata.status();
  metadata_ = std::move(metadata.value());

  bool p2p = metadata_->names_are_rpc_addresses();
  uint16_t fixed_port = config_.legacy_rpc_port_binding ? local->port : 0;
  std::string rpc_bind = p2p || config_.legacy_rpc_port_binding ? "0.0.0.0" : "0.0.0.0";
  // Bound now (the port is part of our name in P2P mode), served only once the state HandleRpc reads is set.
  MC_RETURN_IF_ERROR(rpc_.Bind(rpc_bind, fixed_port, config_.min_rpc_port, config_.max_rpc_port,
                               config_.handshake_backlog, config_.handshake_max_length));
  segment_name_ = p2p ? net::HostPort{local->host, rpc_.port()}.ToString() : options_.local_server_name;

  LoadPlugins();  // once per process: MC_PLUGIN_DIR and the package's plugin folder
  MC_RETURN_IF_ERROR(transports_.Install(options_.protocol, options_.transports, options_.transport_options));
  // Which address peers should use to reach us: a transport's (e.g. its bind address), else local_hostname's
  // when it is an address of this host, else the first LAN address.
  advertised_ip_ = transports_.advertised_address();
  if (advertised_ip_.empty()) {
    auto ip = net::ResolveHost(local->host);
    advertised_ip_ = ip.ok() && net::IsLocalAddress(*ip) && *ip != "0.0.0.0" ? *ip : net::FirstLanIp();
  }
  // Started before the RPC server serves: a handshake method is registered by the time a peer can call it.
  worker_ = std::make_shared<WorkQueue>(1);
  // A small pool: a peer whose descriptor fetch hangs holds one thread; the others serve other segments.
  retry_worker_ = std::make_unique<WorkQueue>(kRetryWorkers);
  TransportContext ctx;
  ctx.config = &config_;
  ctx.memory = &memory_;
  ctx.platforms = &PlatformRegistry::Get();
  ctx.host = this;
  ctx.local_segment_name = segment_name_;
  ctx.advertised_ip = advertised_ip_;
  ctx.host_id = host_id_;
  ctx.instance = instance_;
  ctx.device_filter = options_.device_filter.empty() ? config_.nic_filter : options_.device_filter;
  MC_RETURN_IF_ERROR(transports_.Start(ctx, options_.transport_options));
  SliceRetrier::Services retry;
  retry.descriptor = [this](const std::string& name, bool refresh) { return Descriptor(name, refresh); };
  retry.forget = [this](const std::string& name) { Forget(name); };
  retry.transports = &transports_;
  retry.memory = &memory_;
  retry.worker = retry_worker_.get();
  retry.retry_count = config_.retry_count;
  retrier_ = std::make_unique<SliceRetrier>(std::move(retry));

  managed_ = std::make_unique<ManagedMemory>(
      [this](void* addr, size_t len, int memfd) {
        MemoryRegion region;
        region.start = reinterpret_cast<uint64_t>(addr);
        region.length = len;
        region.location = "*";
        region.backing_fd = memfd;
        return RegisterRegion(std::move(region));
      },
      [this](void* addr) {
        Status st = UnregisterRegion(reinterpret_cast<uint64_t>(addr));
        (void)st;
      });

  MC_RETURN_IF_ERROR(rpc_.Serve([this](const RpcFrame& f) { return HandleRpc(f); }));
  MC_RETURN_IF_ERROR(metadata_->PublishRpcAddress(segment_name_, net::HostPort{advertised_ip_, rpc_.port()},
                                                  [this](const net::HostPort& owner) { return OwnerGone(owner); }));
  Status st = PublishLocal();
  if (!st.ok()) {
    Status undo = metadata_->Unpublish(segment_name_);
    (void)undo;
    return st;
  }
  MC_LOG(kInfo) << "transfer engine '" << segment_name_ << "' ready: rpc " << advertised_ip_ << ":" << rpc_.port()
                << ", transports " << transports_.Names() << ", metadata " << options_.metadata_conn;
  return Status::Ok();
}

StatusOr<std::string> TransferEngine::Impl::CallPeer(const std::string& segment, const std::string& method,
                                                     const std::string& payload) {
  if (segment.empty()) return InvalidArgument("empty segment name");
  auto rpc = metadata_->ResolveRpcAddress(segment);
  if (!rpc.ok()) return rpc.status();
  auto reply = RpcCall(rpc->host, rpc->port, HandshakeMethods::Request(method, payload),
                       config_.handshake_connect_timeout, config_.handshake_max_length);
  if (!reply.ok()) return reply.status();
  return HandshakeMethods::ParseReply(segment, method, reply->body);
}

void TransferEngine::Impl::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (metadata_ && !segment_name_.empty()) {
    std::lock_guard lock(publish_mu_);  // not between a PublishLocal's build and write
    Status st = metadata_->Unpublish(segment_name_);
    if (!st.ok()) MC_LOG(kWarning) << "could not remove metadata of '" << segment_name_ << "': " << st.message();
  }
  rpc_.Stop();
  // The worker first: a retry it runs still finds its transport running; after this, retries are refused
  // and a transport's Stop fails what it still holds.
  if (retry_worker_) retry_worker_->Stop();
  if (worker_) worker_->Stop();
  transports_.Stop();
}

// ---------------------------------------------------------------------------------------------------------
// Metadata

std::string TransferEngine::Impl::BuildLocalDescriptor() const {
  SegmentDescriptor d;
  d.name = segment_name_;
  d.protocol = transports_.protocol();
  d.json = nlohmann::json::object();
  transports_.Describe(d.json);
  d.json["timestamp"] = std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
  d.json["pid"] = getpid();
  // Named segments (HTTP / etcd / Redis metadata) can be taken over by a later process under the same name:
  // peers watch the publishing process (see Descriptor). P2P names embed this process's own bound RPC port.
  if (!metadata_->names_are_rpc_addresses()) d.json["pid_start"] = pid_start_;
  d.json["host_id"] = host_id_;
  d.json["instance"] = instance_;
  for (const auto& r : memory_.List()) {
    if (!r.remote_accessible) continue;
    // Mooncake's location string, unless the platform found device memory the location does not name.
    BufferDescriptor b{r.kind.is_device() && r.location != r.kind.ToString() ? r.kind.ToString() : r.location,
                       r.start, r.length};
    for (const auto& e : r.transports) {
      if (e.declined || !e.descriptor_fields.is_object()) continue;
      for (const auto& [k, v] : e.descriptor_fields.items()) b.json[k] = v;
    }
    d.buffers.push_back(std::move(b));
  }
  return d.Serialize();
}

Status TransferEngine::Impl::PublishLocal() {
  std::lock_guard lock(publish_mu_);
  return metadata_->PublishSegment(segment_name_, BuildLocalDescriptor());
}

StatusOr<std::shared_ptr<const SegmentDescriptor>> TransferEngine::Impl::Descriptor(const std::string& name,
                                                                                  bool refresh) {
  {
    std::lock_guard lock(seg_mu_);
    auto it = defined_.find(name);
    if (it != defined_.end()) return it->second;
  }
  if (!refresh && !config_.disable_metacache) {
    std::unique_lock lock(seg_mu_);
    auto it = cache_.find(name);
    if (it != cache_.end()) {
      if (!it->second.owner || !it->second.owner->Exited()) return it->second.desc;  // Exited(): one poll()
      int pid = it->second.owner->pid();
      lock.unlock();
      MC_LOG(kInfo) << "segment '" << name << "': its process " << pid << " has exited; fetching it again";
      Forget(name);
    }
  }
  StatusOr<std::string> text = name == segment_name_ ? StatusOr<std::string>(BuildLocalDescriptor())
                                                     : metadata_->FetchSegment(name);
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound, "unknown segment '" + name + "': " + text.status().message());
    }
    return text.status();
  }
  auto desc = ParseDescriptor(name, *text);
  if (!desc.ok()) return desc.status();
  CachedSegment entry;
  const nlohmann::json& j = desc->json;
  int pid = j.contains("pid") && j["pid"].is_number_integer() ? j["pid"].get<int>() : 0;
  if (!host_id_.empty() && j.value("host_id", "") == host_id_ && pid > 0 && pid != getpid() &&
      j.contains("pid_start")) {
    uint64_t start = j.contains("pid_start") && j["pid_start"].is_number_unsigned() ? j["pid_start"].get<uint64_t>() : 0;
    auto owner = ProcessWatch::Open(pid, start);
    if (!owner.ok()) {
      Forget(name);
      return Status(ErrorCode::kPeerUnreachable,
                    "segment '" + name + "' was published by a process of this host that is gone (" +
                        owner.status().message() + "); its new owner has not published it yet");
    }
    entry.owner = std::move(owner.value());
  }
  entry.desc = std::make_shared<const SegmentDescriptor>(std::move(desc.value()));
  std::lock_guard lock(seg_mu_);
  cache_[name] = entry;
  return entry.desc;
}

StatusOr<SegmentDescriptor> TransferEngine::Impl::ParseDescriptor(const std::string& name,
                                                                   const std::string& text) const {
  auto desc = SegmentDescriptor::Parse(text);
  if (!desc.ok() && desc.status().code() == ErrorCode::kMalformedJson) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && transports_.CompleteForeignDescriptor(name, j)) {
      auto completed = SegmentDescriptor::Parse(j.dump());
      if (completed.ok()) desc = std::move(completed);
    }
  }
  if (!desc.ok()) return Status(desc.status().code(), "segment '" + name + "': " + desc.status().message());
  // Known by the name it was looked up under, whatever its `name` field says: transports key their per-peer
  // state (connections, open files) by it, and ForgetPeer(name) must reach all of it.
  desc->name = name;
  return desc;
}

void TransferEngine::Impl::Forget(const std::string& name) {
  {
    std::lock_guard lock(seg_mu_);
    cache_.erase(name);
  }
  transports_.ForgetPeer(name);
}

StatusOr<std::string> TransferEngine::Impl::SegmentNameOf(SegmentHandle h) const {
  if (h == kLocalSegment) return segment_name_;
  std::lock_guard lock(seg_mu_);
  if (h == kInvalidSegment || h > handle_names_.size()) {
    return InvalidArgument("unknown segment handle " + std::to_string(h) + " (open the segment first)");
  }
  return handle_names_[h - 1];
}

StatusOr<std::string> TransferEngine::Impl::HandleRpc(const RpcFrame& frame) {
  switch (frame.type) {
    case RpcType::kMetadata: {
      auto j = nlohmann::json::parse(frame.body, nullptr, false);
      std::string wanted;  // any client may send this: a non-string field must not throw
      if (j.is_object() && j.contains("segment_name") && j["segment_name"].is_string()) {
        wanted = j["segment_name"].get<std::string>();
      }
      if (!wanted.empty() && wanted != segment_name_) {
        return NotFound("this engine serves segment '" + segment_name_ + "', not '" + wanted + "'");
      }
      return BuildLocalDescriptor();
    }
    case RpcType::kNotify: {
      auto j = nlohmann::json::parse(frame.body, nullptr, false);
      if (!j.is_object() || !j.contains("name") || !j.contains("notify_msg") || !j["name"].is_string() ||
          !j["notify_msg"].is_string()) {
        return Status(ErrorCode::kMalformedJson, "notify needs string fields name and notify_msg");
      }
      MC_RETURN_IF_ERROR(
          notifications_.Push({j["name"].get<std::string>(), j["notify_msg"].get<std::string>()}));
      return std::string(R"({"name":"","notify_msg":"success"})");
    }
    case RpcType::kProbe:
      return std::string(R"({"status":"success"})");
    case RpcType::kConnection:
      return methods_.Handle(frame.body, transports_.Names());
  }
  return InvalidArgument("unknown RPC type");
}

Status TransferEngine::Impl::SendNotifyImpl(const std::string& segment, const Notification& n) {
  if (segment.empty()) return InvalidArgument("empty segment name");
  auto rpc = metadata_->ResolveRpcAddress(segment);
  if (!rpc.ok()) return rpc.status();
  RpcFrame f;
  f.type = RpcType::kNotify;
  f.body = nlohmann::json{{"name", n.name}, {"notify_msg", n.message}}.dump();
  auto reply = RpcCall(rpc->host, rpc->port, f, config_.handshake_connect_timeout, config_.handshake_max_length);
  if (!reply.ok()) return reply.status();
  auto j = nlohmann::json::parse(reply->body, nullptr, false);
  if (!j.is_object() || j.value("notify_msg", "") != "success") {
    return Status(ErrorCode::kRejectHandshake, "segment '" + segment + "' refused the notification: " + reply->body);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// Batches

StatusOr<std::shared_ptr<Batch>> TransferEngine::Impl::FindBatch(BatchId id) const {
  std::lock_guard lock(batch_mu_);
  auto it = batches_.find(id);
  if (it == batches_.end()) return InvalidArgument("unknown batch id " + std::to_string(id));
  return it->second;
}

Status TransferEngine::Impl::SubmitImpl(Batch& b, const std::vector<TransferRequest>& requests,
                                        const Notification* notify, bool drive) {
  std::lock_guard submit_lock(b.submit_mutex());  // concurrent submits to one batch take distinct slots
  if (b.size() + requests.size() > b.capacity()) {
    return Status(ErrorCode::kTooManyRequests, "the batch has room for " +
                                                   std::to_string(b.capacity() - b.size()) + " more requests, got " +
                                                   std::to_string(requests.size()));
  }
  // Validate everything before starting anything.
  struct Plan {
    const TransferRequest* req;
    RegionPin pin;
    std::shared_ptr<const SegmentDescriptor> desc;
    Transport* transport;
    std::string segment;
    MemoryKind remote_kind;
    std::vector<uint64_t> cuts;  // target buffer boundaries inside the range (a request over several buffers)
  };
  std::vector<Plan> plans;
  plans.reserve(requests.size());
  std::string notify_target;
  for (const auto& r : requests) {
    if (r.source == nullptr && r.length > 0) return InvalidArgument("request with a null source");
    auto src = reinterpret_cast<uint64_t>(r.source);
    RegionPin pin = memory_.Find(src, r.length == 0 ? 1 : r.length, /*remote=*/false);
    if (!pin) {
      return Status(ErrorCode::kAddressNotRegistered, "local range [" + Hex(src) + ", +" + std::to_string(r.length) +
                                                          ") is not inside registered memory (register_memory first)");
    }
    auto name = SegmentNameOf(r.target);
    if (!name.ok()) return name.status();
    auto desc = Descriptor(*name, /*refresh=*/false);
    if (!desc.ok()) return desc.status();
    // One buffer holds the range, or buffers back to back do (a file segment's files, adjacent registrations:
    // the request is split at their boundaries); else the peer may have registered memory since it was cached.
    std::vector<const BufferDescriptor*> run;
    auto locate = [&](const SegmentDescriptor& d) {
      run.clear();
      if (const BufferDescriptor* b = d.FindBuffer(r.target_address, r.length == 0 ? 1 : r.length)) {
        run.push_back(b);
      } else {
        run = d.FindBufferRun(r.target_address, r.length);
      }
    };
    locate(**desc);
    if (run.empty()) {
      desc = Descriptor(*name, /*refresh=*/true);
      if (!desc.ok()) return desc.status();
      locate(**desc);
    }
    if (run.empty()) {
      return Status(ErrorCode::kAddressNotRegistered,
                    "target range [" + Hex(r.target_address) + ", +" + std::to_string(r.length) +
                        ") is not inside any buffer segment '" + *name + "' registered");
    }
    const BufferDescriptor* target = run.front();
    std::vector<uint64_t> cuts;
    for (size_t i = 1; i < run.size(); ++i) {
      const uint64_t cut = run[i]->addr;  // strictly inside the range, increasing (FindBufferRun's contract)
      if (cut <= r.target_address || cut >= r.target_address + r.length || (!cuts.empty() && cut <= cuts.back())) {
        return Status(ErrorCode::kAddressNotRegistered, "segment '" + *name + "': buffers around [" +
                                                            Hex(r.target_address) + ", +" +
                                                            std::to_string(r.length) + ") overlap");
      }
      cuts.push_back(cut);
    }
    MemoryKind remote_kind = RemoteKind(*target);
    Transport* transport = transports_.Select(**desc, *pin, remote_kind);
    if (!transport) {
      return Status(ErrorCode::kNotImplemented,
                    "no installed transport (" + transports_.Names() + ") moves " + pin->kind.ToString() + " memory to " +
                        remote_kind.ToString() + " memory of segment '" + *name + "' (protocol " +
                        (*desc)->protocol + ")");
    }
    if (notify_target.empty()) notify_target = *name;
    plans.push_back({&r, std::move(pin), std::move(desc.value()), transport, *name, remote_kind, std::move(cuts)});
  }
  if (!b.retry_hook()) {
    SliceRetrier* retrier = retrier_.get();
    b.SetRetryHook([retrier](Slice* slice, const Status& st, SliceRetry retry) {
      return retrier->OnFailure(slice, st, retry);
    });
  }
  // Cut into slices and hand them to the transports, grouped per (transport, segment).
  const auto now = std::chrono::steady_clock::now();
  std::map<std::pair<Transport*, const SegmentDescriptor*>, std::vector<Slice*>> groups;
  std::shared_ptr<LatencyHistogram> latency;  // of the previous plan: most batches have one (transport, segment)
  const Transport* latency_transport = nullptr;
  const std::string* latency_segment = nullptr;
  for (auto& p : plans) {
    if (!latency || p.transport != latency_transport || p.segment != *latency_segment) {
      latency = latency_.For(p.transport->name(), p.segment);
      latency_transport = p.transport;
      latency_segment = &p.segment;
    }
    auto task = b.AddTask();
    if (!task.ok()) return task.status();  // cannot happen: capacity checked above
    std::vector<Slice> slices;
    uint64_t from = p.req->target_address;
    const uint64_t end = p.req->target_address + p.req->length;
    for (size_t i = 0; i <= p.cuts.size(); ++i) {  // one run of slices per target buffer
      const uint64_t to = i < p.cuts.size() ? p.cuts[i] : end;
      auto piece = CutIntoSlices(p.req->opcode, static_cast<char*>(p.req->source) + (from - p.req->target_address),
                                 from, to - from, p.transport->slice_size());
      if (slices.empty()) {
        slices = std::move(piece);
      } else {
        slices.insert(slices.end(), std::make_move_iterator(piece.begin()), std::make_move_iterator(piece.end()));
      }
      from = to;
    }
    for (auto& s : slices) {
      s.tried_transports = transports_.Bit(p.transport);
      s.handed_out = now;
    }
    (*task)->route = {p.segment, p.pin->kind, p.remote_kind, latency};
    b.StartTask(*task, std::move(slices), std::move(p.pin));
    auto& group = groups[{p.transport, p.desc.get()}];
    for (auto& s : (*task)->slices()) group.push_back(&s);
  }
  // Registered once the tasks exist, so it fires when they are done (at once if they already are).
  if (notify) {
    Notification n = *notify;
    auto self = this;
    std::weak_ptr<WorkQueue> worker = worker_;  // stopped (refusing jobs) once the engine shuts down
    b.OnFinished([self, worker, n, notify_target](const Batch& done) {
      if (done.status().state != TransferState::kCompleted) {
        MC_LOG(kWarning) << "notification to '" << notify_target << "' not sent: the batch failed";
        return;
      }
      auto queue = worker.lock();
      if (!queue) return;
      queue->Post([self, n, notify_target] {
        Status st = self->SendNotifyImpl(notify_target, n);
        if (!st.ok()) MC_LOG(kWarning) << "notification to '" << notify_target << "' failed: " << st.message();
      });
    });
  }
  if (drive && groups.size() == 1) {
    auto& [key, slices] = *groups.begin();
    key.first->SubmitAndDrive(*key.second, slices);
    return Status::Ok();
  }
  for (auto& [key, slices] : groups) key.first->Submit(*key.second, slices);
  return Status::Ok();
}

}  // namespace mooncake::te
