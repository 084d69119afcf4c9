#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_FABRIC_API_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_FABRIC_API_H_

// libfabric, resolved at run time. Only the library's exported entry points are in the table: everything else
// of the API (fi_domain, fi_endpoint, fi_mr_reg, fi_write, fi_cq_sread, ...) is a static inline in the headers
// that calls through the ops tables of the objects these functions return, so nothing links libfabric.

#include <rdma/fabric.h>

#include <cstdint>
#include <string>

#include "transfer_engine/api/status.h"

namespace mooncake::te::efa {

/// The exported functions of libfabric.so.1. Immutable after Load; shared by every transport of the process.
struct FabricApi {
  uint32_t (*version)();
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags,
                 const struct fi_info* hints, struct fi_info** info);
  void (*freeinfo)(struct fi_info* info);
  struct fi_info* (*dupinfo)(const struct fi_info* info);
  int (*fabric)(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context);
  const char* (*strerror)(int errnum);

  /// The API version to ask for: the library's own, at most FI_VERSION(1, 18) (below 1.18 the EFA provider
  /// keeps a legacy default; Debian's 1.17 refuses a request for 1.18 with -FI_ENOSYS).
  uint32_t RequestVersion() const;
  /// "fi_xxx: <libfabric's text> (-N)".
  std::string Error(const char* what, int rc) const;
};

/// Loads libfabric.so.1 once per process (never unloaded); kNotImplemented with the dlopen/dlsym text when it
/// is missing or lacks an entry point. Thread-safe.
StatusOr<const FabricApi*> LoadFabricApi();

}  // namespace mooncake::te::efa

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_FABRIC_API_H_
