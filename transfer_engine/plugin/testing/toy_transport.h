#ifndef MOONCAKE_TRANSFER_ENGINE_PLUGIN_TESTING_TOY_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_PLUGIN_TESTING_TOY_TRANSPORT_H_

// A transport that moves nothing, for the plugin loader's tests: it can be created, started and stopped, reaches
// no peer and fails every slice it is given (kNotImplemented, final).

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/transport/transport.h"

namespace mooncake::te::testing {

class ToyTransport : public Transport {
 public:
  explicit ToyTransport(std::string name) : name_(std::move(name)) {}

  std::string name() const override { return name_; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.priority = -100;  // never preferred
    return caps;
  }
  Status Start(const TransportContext& /*ctx*/) override { return Status::Ok(); }
  void Stop() override {}
  void Describe(nlohmann::json& descriptor) const override { descriptor[name_] = {{"toy", true}}; }
  bool CanReach(const SegmentDescriptor& /*peer*/) const override { return false; }
  void Submit(const SegmentDescriptor& /*peer*/, const std::vector<Slice*>& slices) override {
    for (Slice* s : slices) s->Fail(Status(ErrorCode::kNotImplemented, name_ + " moves nothing"), SliceRetry::kFinal);
  }
  size_t slice_size() const override { return 1 << 20; }

 private:
  std::string name_;
};

/// Usable only where MC_TOY_DEVICE is set to a non-empty value; otherwise "no toy device".
inline TransportProbe ProbeToyDevice() {
  const char* dev = std::getenv("MC_TOY_DEVICE");
  if (dev == nullptr || dev[0] == '\0') return TransportProbe{false, "no toy device"};
  return TransportProbe{true, ""};
}

}  // namespace mooncake::te::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_PLUGIN_TESTING_TOY_TRANSPORT_H_
