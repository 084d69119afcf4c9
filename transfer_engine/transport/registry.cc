#include "transfer_engine/transport/transport.h"

namespace mooncake::te {

TransportRegistry& TransportRegistry::Get() {
  static TransportRegistry* registry = new TransportRegistry();
  return *registry;
}

void TransportRegistry::Register(const std::string& name, TransportFactory factory) {
  factories_.emplace_back(name, std::move(factory));
}

std::unique_ptr<Transport> TransportRegistry::Create(const std::string& name) const {
  for (const auto& [n, f] : factories_) {
    if (n == name) return f();
  }
  return nullptr;
}

std::vector<std::string> TransportRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : factories_) out.push_back(n);
  return out;
}

}  // namespace mooncake::te
