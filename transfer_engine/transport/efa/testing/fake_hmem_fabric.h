#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_TESTING_FAKE_HMEM_FABRIC_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_TESTING_FAKE_HMEM_FABRIC_H_

// FakeHmemFabric: a fake of libfabric's device-memory support (FI_HMEM) laid over a real provider that has
// none (tcp;ofi_rxm), for tests on a host without GPUs. It is a FabricApi table (fabric_api.h) whose entries
// are the real libfabric's, except:
// - fi_getinfo answers hints that ask for FI_HMEM (and FI_MR_HMEM) with the real provider's entries for the
//   same hints without them, marked FI_HMEM and FI_MR_HMEM;
// - fi_fabric returns the real fabric with its ops table swapped, so that fi_domain and fi_endpoint take such
//   marked entries (the marks are removed before the real provider sees them), and fi_mr_regattr of its
//   domains registers device memory (any iface) as host memory, recording the iface and device. That is
//   faithful for the host emulation platform, whose device memory is host memory.
// Everything else (fi_mr_reg, RMA, completion queues) is the real provider's. Process-wide; thread-safe.

#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/efa/fabric_api.h"

namespace mooncake::te::efa::testing {

/// One fi_mr_regattr call the fake saw.
struct FakeHmemRegistration {
  enum fi_hmem_iface iface = FI_HMEM_SYSTEM;
  uint64_t device = 0;  ///< fi_mr_attr.device (the cuda ordinal for FI_HMEM_CUDA)
  const void* addr = nullptr;
  size_t length = 0;
};

/// The fake table (loads the real libfabric first; its error when that fails).
StatusOr<const FabricApi*> FakeHmemFabricApi();

/// Every fi_mr_regattr the fake's domains served, in order.
std::vector<FakeHmemRegistration> FakeHmemRegistrations();

}  // namespace mooncake::te::efa::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_EFA_TESTING_FAKE_HMEM_FABRIC_H_
