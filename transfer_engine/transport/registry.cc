#include "transfer_engine/transport/transport.h"

#include "transfer_engine/common/log.h"

namespace mooncake::te {

TransportRegistry& TransportRegistry::Get() {
  static TransportRegistry* registry = new TransportRegistry();
  return *registry;
}

Status TransportRegistry::Register(TransportPlugin plugin) {
  std::lock_guard lock(mu_);
  for (const auto& p : plugins_) {
    if (p->name == plugin.name) {
      return Status(ErrorCode::kAddressOverlapped, "a transport named '" + plugin.name + "' is already registered (" +
                                                       p->origin + ")");
    }
  }
  if (plugin.protocols.empty()) plugin.protocols.push_back(plugin.name);
  plugins_.push_back(std::make_unique<TransportPlugin>(std::move(plugin)));
  return Status::Ok();
}

const TransportPlugin* TransportRegistry::FindByProtocol(const std::string& protocol) const {
  std::lock_guard lock(mu_);
  for (const auto& p : plugins_) {
    if (p->name == protocol) return p.get();
  }
  for (const auto& p : plugins_) {
    for (const auto& proto : p->protocols) {
      if (proto == protocol) return p.get();
    }
  }
  return nullptr;
}

std::vector<TransportPlugin> TransportRegistry::All() const {
  std::lock_guard lock(mu_);
  std::vector<TransportPlugin> out;
  for (const auto& p : plugins_) out.push_back(*p);
  return out;
}

std::vector<std::string> TransportRegistry::Names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& p : plugins_) out.push_back(p->name);
  return out;
}

TransportRegistrar::TransportRegistrar(TransportPlugin plugin) {
  std::string name = plugin.name;
  Status st = TransportRegistry::Get().Register(std::move(plugin));
  if (!st.ok()) MC_LOG(kWarning) << "transport '" << name << "' not registered: " << st.message();
}

}  // namespace mooncake::te
