#include "transfer_engine/core/transport_set.h"

#include <algorithm>
#include <utility>

#include "transfer_engine/common/env.h"
#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"

namespace mooncake::te {

Status TransportSet::Install(const std::string& requested, const std::vector<std::string>& requested_only,
                             const std::map<std::string, std::string>& options) {
  auto& registry = TransportRegistry::Get();
  std::vector<TransportPlugin> plugins = registry.All();
  std::string known;
  for (const auto& p : plugins) known += (known.empty() ? "" : ", ") + p.name;
  std::string protocol = requested;
  std::vector<std::string> only = requested_only;
  for (const auto& p : plugins) {
    if (!p.exclusive_env.empty() && EnvFlag(p.exclusive_env.c_str())) {
      MC_LOG(kInfo) << p.exclusive_env << " is set: installing only the '" << p.name << "' transport";
      only = {p.name};
      protocol = p.protocols.empty() ? p.name : p.protocols.front();
      break;
    }
  }
  auto wanted = [&](const TransportPlugin& p) {
    return only.empty() || std::find(only.begin(), only.end(), p.name) != only.end();
  };
  // The preferred protocol's transport: it must run, and it comes first.
  const TransportPlugin* preferred = nullptr;
  if (!protocol.empty()) {
    preferred = registry.FindByProtocol(protocol);
    if (!preferred) {
      return Status(ErrorCode::kNotImplemented, "protocol '" + protocol +
                                                    "' is served by no transport of this build (transports: " +
                                                    known + "; a plugin may be missing: see plugins())");
    }
    if (!wanted(*preferred)) {
      return InvalidArgument("protocol '" + protocol + "' is served by transport '" + preferred->name +
                             "', which the transport list excludes");
    }
  }
  auto create = [&](const TransportPlugin& p, bool required) -> Status {
    TransportProbe probe = p.probe ? p.probe() : TransportProbe{};
    if (!probe.usable) {
      if (required) {
        return Status(ErrorCode::kNotImplemented,
                      "protocol '" + protocol + "' (transport '" + p.name + "') cannot run here: " + probe.reason);
      }
      MC_LOG(kInfo) << "transport '" << p.name << "' skipped: " << probe.reason;
      return Status::Ok();
    }
    std::unique_ptr<Transport> t = p.create ? p.create() : nullptr;
    Status st = t ? t->Configure(TransportOptions(p.name, options))
                  : Status(ErrorCode::kNotImplemented, "its plugin created nothing");
    if (!st.ok()) {
      if (required) return Status(st.code(), "transport '" + p.name + "': " + st.message());
      MC_LOG(kWarning) << "transport '" << p.name << "' skipped: " << st.message();
      return Status::Ok();
    }
    transports_.push_back(std::move(t));
    return Status::Ok();
  };
  if (preferred) {
    MC_RETURN_IF_ERROR(create(*preferred, /*required=*/true));
    preferred_ = preferred->name;
  }
  for (const auto& p : plugins) {
    if (preferred && p.name == preferred->name) continue;
    if (wanted(p)) MC_RETURN_IF_ERROR(create(p, /*required=*/false));
  }
  if (transports_.empty()) return Status(ErrorCode::kNotImplemented, "no usable transport (transports: " + known + ")");
  protocol_ = preferred ? protocol : transports_.front()->name();
  return Status::Ok();
}

Status TransportSet::Start(TransportContext ctx, const std::map<std::string, std::string>& options) {
  ctx.protocol = protocol_;
  for (auto& t : transports_) {
    ctx.options = TransportOptions(t->name(), options);
    Status st = t->Start(ctx);
    if (!st.ok()) return Status(st.code(), "transport '" + t->name() + "' failed to start: " + st.message());
  }
  return Status::Ok();
}

void TransportSet::Stop() {
  for (auto& t : transports_) t->Stop();
}

std::string TransportSet::advertised_address() const {
  for (const auto& t : transports_) {
    std::string a = t->advertised_address();
    if (!a.empty()) return a;
  }
  return "";
}

Transport* TransportSet::Select(const SegmentDescriptor& desc, const MemoryRegion& local, MemoryKind remote,
                                uint64_t exclude) const {
  auto rank = [&](const Transport& t, const TransportCapabilities& c) {
    if (!c.remote_hosts) return std::make_pair(2, c.priority);
    return std::make_pair(t.name() == preferred_ ? 1 : 0, c.priority);
  };
  Transport* best = nullptr;
  std::pair<int, int> best_rank{-1, 0};
  for (const auto& owned : transports_) {
    Transport* t = owned.get();
    if (Bit(t) & exclude) continue;
    TransportCapabilities c = t->capabilities();
    if (!c.Moves(local.kind.type, remote.type) || local.declined_by(t->name()) || !t->CanReach(desc)) continue;
    auto r = rank(*t, c);
    if (!best || r > best_rank) {
      best = t;
      best_rank = r;
    }
  }
  return best;
}

uint64_t TransportSet::Bit(const Transport* t) const {
  for (size_t i = 0; i < transports_.size() && i < 64; ++i) {
    if (transports_[i].get() == t) return uint64_t{1} << i;
  }
  return 0;
}

Status TransportSet::Register(MemoryRegion& region) {
  auto undo = [&] {
    for (auto it = region.transports.rbegin(); it != region.transports.rend(); ++it) {
      for (auto& t : transports_) {
        if (t->name() == it->transport && !it->declined) t->UnregisterRegion(region);
      }
    }
    region.transports.clear();
  };
  for (auto& t : transports_) {
    auto r = t->RegisterRegion(region);
    if (!r.ok()) {
      undo();
      return Status(r.status().code(), "transport '" + t->name() + "' refused the registration of " +
                                           Range(region.start, region.length) + ": " + r.status().message());
    }
    region.transports.push_back({t->name(), std::move(r->descriptor_fields), std::move(r->state), r->declined,
                                 std::move(r->why_declined)});
  }
  return Status::Ok();
}

void TransportSet::Withdraw(const MemoryRegion& region) {
  for (auto& t : transports_) {
    if (region.transport(t->name()) && !region.declined_by(t->name())) t->WithdrawRegion(region);
  }
}

void TransportSet::Unregister(const MemoryRegion& region) {
  for (auto& t : transports_) {
    if (region.transport(t->name()) && !region.declined_by(t->name())) t->UnregisterRegion(region);
  }
}

void TransportSet::Describe(nlohmann::json& descriptor) const {
  for (const auto& t : transports_) t->Describe(descriptor);
}

bool TransportSet::CompleteForeignDescriptor(const std::string& segment_name, nlohmann::json& descriptor) const {
  for (const auto& t : transports_) {
    if (t->CompleteForeignDescriptor(segment_name, descriptor)) return true;
  }
  return false;
}

void TransportSet::ForgetPeer(const std::string& segment_name) {
  for (auto& t : transports_) t->ForgetPeer(segment_name);
}

void TransportSet::AddStats(nlohmann::json& out) const {
  for (const auto& t : transports_) {
    out[t->name()] = t->Stats();
    auto l = t->ListenerStats();
    if (!l.is_null()) out["listeners"][t->name()] = std::move(l);
  }
}

std::string TransportSet::Names() const {
  std::string out;
  for (const auto& t : transports_) out += (out.empty() ? "" : "+") + t->name();
  return out;
}

std::vector<std::string> TransportSet::List() const {
  std::vector<std::string> out;
  for (const auto& t : transports_) out.push_back(t->name());
  return out;
}

}  // namespace mooncake::te
