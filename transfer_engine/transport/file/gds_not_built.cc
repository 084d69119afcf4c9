// Gds for a build without cufile.h (no nvidia-cufile-cu12 in the Python environment and no CUDA toolkit that
// ships it): every Open fails with the reason, so GPU memory is declined as on a host without GDS.
#include "transfer_engine/transport/file/gds.h"

namespace mooncake::te::file {

struct Gds::Api {};

StatusOr<std::unique_ptr<Gds>> Gds::Open(const std::string& /*library*/) {
  return Status(ErrorCode::kNotImplemented,
                "this build has no cufile.h (install nvidia-cufile-cu12 from ci/requirements.lock and rebuild)");
}

Gds::~Gds() = default;
Status Gds::RegisterBuffer(void*, size_t) { return Status(ErrorCode::kNotImplemented, "no GDS in this build"); }
void Gds::DeregisterBuffer(void*) {}
Status Gds::Transfer(OpenFile&, bool, void*, size_t, size_t, uint64_t) {
  return Status(ErrorCode::kNotImplemented, "no GDS in this build");
}

}  // namespace mooncake::te::file
