// Platform "toyplat": usable, no devices of its own memory, every operation kNotImplemented. Registered through
// MC_PLATFORM_PLUGIN with no probe function, so the loader asks Platform::Probe.
#include <memory>
#include <optional>
#include <string>

#include "transfer_engine/plugin/plugin.h"

namespace mooncake::te::testing {
namespace {

class ToyPlatform : public Platform {
 public:
  std::string name() const override { return "toyplat"; }
  MemoryType device_type() const override { return MemoryType::kCxl; }
  PlatformProbe Probe() override { return PlatformProbe{true, "1 toy device", 1}; }
  std::optional<MemoryKind> Classify(const void* /*ptr*/) override { return std::nullopt; }
  StatusOr<void*> Allocate(size_t /*length*/, AllocationKind /*kind*/, int /*device*/) override { return No(); }
  Status Free(void* /*ptr*/, size_t /*length*/, AllocationKind /*kind*/) override { return No(); }
  StatusOr<std::string> ExportIpc(void* /*ptr*/, size_t /*length*/) override { return No(); }
  StatusOr<void*> ImportIpc(const std::string& /*handle*/, int /*owner_pid*/, size_t /*length*/) override {
    return No();
  }
  Status CloseIpc(void* /*mapped*/, size_t /*length*/) override { return No(); }
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void* /*dst*/, const void* /*src*/, size_t /*length*/,
                                                      int /*device*/, void* /*stream*/) override {
    return No();
  }

 private:
  static Status No() { return Status(ErrorCode::kNotImplemented, "toyplat does nothing"); }
};

}  // namespace

MC_PLATFORM_PLUGIN("toyplat", ToyPlatform, nullptr);

}  // namespace mooncake::te::testing
