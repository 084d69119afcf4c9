#include "transfer_engine/transport/nvlink/nvlink_transport.h"

#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transfer_engine/common/log.h"
#include "transfer_engine/plugin/plugin.h"
#include "transfer_engine/transport/device_ipc/handle_hex.h"
#include "transfer_engine/transport/device_ipc/probe.h"
#include "transfer_engine/transport/nvlink/nvml_domain.h"

namespace mooncake::te::nvlink {

using device_ipc::kEpochSlots;
using device_ipc::kEpochTableBytes;

struct NvlinkTransport::Table {
  std::shared_ptr<Platform> platform;
  void* base = nullptr;  // kEpochTableBytes of fabric memory
  std::string handle;    // its fabric handle
  ~Table() {
    if (base != nullptr) (void)platform->Free(base, kEpochTableBytes, AllocationKind::kFabric);
  }
};

namespace {

// Copies `length` bytes with the platform and waits.
Status CopyAndWait(Platform& platform, void* dst, const void* src, size_t length) {
  auto started = platform.CopyAsync(dst, src, length, -1);
  if (!started.ok()) return started.status();
  return (*started)->Wait();
}

// The epoch tables of peers: each imported once per peer instance with ImportFabric, read-only (a bug of ours
// cannot corrupt a peer's epochs), a slot read with an 8-byte copy. Thread-safe.
class FabricPeerEpochs final : public device_ipc::PeerEpochs {
 public:
  FabricPeerEpochs(std::shared_ptr<Platform> platform, device_ipc::EpochFields fields)
      : PeerEpochs("nvlink", std::move(fields)), platform_(std::move(platform)) {}

  void Forget(const std::string& segment_name) override {
    std::lock_guard lock(mu_);
    for (auto it = tables_.begin(); it != tables_.end();) {
      it = it->second.segment == segment_name ? tables_.erase(it) : std::next(it);  // unmapped by its last reader
    }
  }

 protected:
  StatusOr<uint64_t> Read(const SegmentDescriptor& desc, const std::string& instance, uint32_t slot) override {
    std::shared_ptr<Table> table;
    {
      std::lock_guard lock(mu_);  // only to find or import the table: the read below runs without it
      auto it = tables_.find(instance);
      if (it == tables_.end()) {
        Entry entry{desc.name, nullptr, Status::Ok()};
        const std::optional<std::string> hex = JsonString(desc.json, kEpochTableField);
        auto handle = hex ? device_ipc::HandleFromHex(*hex)
                          : StatusOr<std::string>(Status(ErrorCode::kMalformedJson, "nvlink: segment '" + desc.name +
                                                                                        "' publishes no epoch table"));
        auto mapped = handle.ok() ? platform_->ImportFabric(*handle, kEpochTableBytes, FabricAccess::kReadOnly)
                                  : handle.status();
        if (mapped.ok()) {
          entry.table = std::make_shared<Table>(platform_, static_cast<char*>(*mapped));
        } else {  // remembered for this peer instance (until Forget): not imported again for every slice
          entry.failure = handle.ok() ? Status(mapped.status().code(), "nvlink: importing the epoch table of '" +
                                                                           desc.name + "': " + mapped.status().message())
                                      : handle.status();
        }
        it = tables_.emplace(instance, std::move(entry)).first;
      }
      if (!it->second.table) return it->second.failure;
      table = it->second.table;
    }
    uint64_t value = 0;
    Status st = CopyAndWait(*platform_, &value, table->base + slot * sizeof(uint64_t), sizeof(value));
    if (!st.ok()) return Status(st.code(), "nvlink: reading the epoch of '" + desc.name + "': " + st.message());
    return value;
  }

 private:
  /// One peer instance's imported epoch table; unmapped when the last holder (the map, a read in progress) lets go.
  struct Table {
    Table(std::shared_ptr<Platform> p, char* b) : platform(std::move(p)), base(b) {}
    ~Table() { (void)platform->CloseFabric(base, kEpochTableBytes); }
    std::shared_ptr<Platform> platform;
    char* base;
  };
  struct Entry {
    std::string segment;
    std::shared_ptr<Table> table;  // null: the import failed with `failure`
    Status failure;
  };
  std::shared_ptr<Platform> platform_;
  std::mutex mu_;
  std::map<std::string, Entry> tables_;  // by peer instance
};

}  // namespace

TransportProbe ProbeNvlink() {
  TransportProbe p = device_ipc::ProbeRuntime(
      "cuda", "host emulation of CUDA devices and fabric handles (MC_PLATFORM_EMULATION=1; not a GPU, no NVSwitch)",
      {"libcuda.so.1"}, "CUDA driver", "no CUDA driver");
  if (p.usable && p.reason.rfind("CUDA driver found", 0) == 0) p.reason += "; fabric handle support is checked at start";
  return p;
}

NvlinkTransport::NvlinkTransport()
    : DeviceIpcTransport(device_ipc::DeviceIpcSpec{"nvlink", "MC_NVLINK", MemoryType::kCuda, "CUDA",
                                                   /*remote_hosts=*/true, AllocationKind::kFabric}) {}

NvlinkTransport::~NvlinkTransport() { Stop(); }  // every copy done before the table goes

Status NvlinkTransport::Configure(const TransportOptions& options) {
  MC_RETURN_IF_ERROR(DeviceIpcTransport::Configure(options));
  domain_ = options.String("domain", "MC_NVLINK_DOMAIN", "");
  device_ = static_cast<int>(options.Int("device", "MC_NVLINK_DEVICE", 0, 0, 1 << 16));
  const std::string nvml = options.String("nvml_library", "MC_NVLINK_NVML_LIBRARY", "");
  nvml_sonames_ = nvml.empty() ? DefaultNvmlSonames() : std::vector<std::string>{nvml};
  return Status::Ok();
}

std::string NvlinkTransport::DomainFromNvml() {
  const int count = platform()->Probe().device_count;
  std::string domain, first_gpu;
  for (int device = 0; device < count || device == 0; ++device) {
    const std::string which = "device " + std::to_string(device);
    auto locality = platform()->Locality(device);
    if (!locality.ok()) return which + "'s PCI address is unknown: " + locality.status().message();
    if (locality->pci_bus_id.empty()) return "the " + platform()->name() + " platform knows no PCI address of " + which;
    auto found = NvlinkDomainFromNvml(nvml_sonames_, locality->pci_bus_id);
    if (!found.ok() && device == 0) return found.status().message();
    if (!found.ok()) {
      return "GPU " + first_gpu + " is in NVLink domain '" + domain + "' but " + which + " has none (" +
             found.status().message() + "); make only GPUs of one domain visible";
    }
    if (device == 0) {
      domain = *found;
      first_gpu = locality->pci_bus_id;
    } else if (*found != domain) {
      return "the GPUs of this process are in different NVLink domains (GPU " + first_gpu + ": '" + domain +
             "', GPU " + locality->pci_bus_id + ": '" + *found + "'); make only GPUs of one domain visible "
             "(CUDA_VISIBLE_DEVICES)";
    }
  }
  domain_ = domain;
  MC_LOG(kInfo) << "nvlink: NVLink domain from NVML (the fabric cluster UUID and clique of all " << count
                << " GPUs)";
  return "";
}

std::string NvlinkTransport::StartHooks() {
  if (domain_.empty()) {
    const std::string why = DomainFromNvml();
    if (!why.empty()) {
      return "no NVLink domain: NVML gives none (" + why + "); set MC_NVLINK_DOMAIN (or the option nvlink.domain) "
             "to the fabric's cluster id, the same on every host of the domain";
    }
  }
  auto table = std::make_shared<Table>();
  table->platform = platform();
  auto base = platform()->Allocate(kEpochTableBytes, AllocationKind::kFabric, device_);
  if (!base.ok()) return base.status().message();  // "fabric handles unsupported: ..." where the driver refuses
  table->base = *base;
  std::vector<uint64_t> zeros(kEpochSlots, 0);  // device memory need not start zeroed
  Status st = CopyAndWait(*platform(), table->base, zeros.data(), kEpochTableBytes);
  if (!st.ok()) return "clearing the epoch table: " + st.message();
  auto handle = platform()->ExportFabric(table->base, kEpochTableBytes);
  if (!handle.ok()) return handle.status().message();
  table->handle = std::move(*handle);
  table_ = std::move(table);
  MC_LOG(kInfo) << "nvlink: NVLink domain '" << domain_ << "'";
  return "";
}

StatusOr<std::string> NvlinkTransport::ExportRegion(void* ptr, size_t length) {
  return platform()->ExportFabric(ptr, length);
}

device_ipc::MappingOps NvlinkTransport::MakeMappingOps() {
  std::shared_ptr<Platform> p = platform();
  device_ipc::MappingOps ops;
  ops.what = "nvlink";
  ops.import = [p](const std::string& handle, int, size_t length) { return p->ImportFabric(handle, length); };
  ops.close = [p](void* mapped, size_t length) { return p->CloseFabric(mapped, length); };
  return ops;
}

std::unique_ptr<device_ipc::LocalEpochs> NvlinkTransport::MakeLocalEpochs() {
  std::shared_ptr<Table> table = table_;
  return std::make_unique<device_ipc::LocalEpochs>([table](uint32_t slot, uint64_t value) {
    char* at = static_cast<char*>(table->base) + slot * sizeof(uint64_t);
    Status st = CopyAndWait(*table->platform, at, &value, sizeof(value));
    if (!st.ok()) MC_LOG(kError) << "nvlink: publishing an epoch failed (peers may copy into it): " << st.message();
  });
}

std::unique_ptr<device_ipc::PeerEpochs> NvlinkTransport::MakePeerEpochs() {
  device_ipc::EpochFields fields = epoch_fields();
  fields.table = kEpochTableField;
  return std::make_unique<FabricPeerEpochs>(platform(), std::move(fields));
}

void NvlinkTransport::DescribeEpochs(nlohmann::json& descriptor) const {
  descriptor[kDomainField] = domain_;
  descriptor[kEpochTableField] = device_ipc::HandleToHex(table_->handle);
}

bool NvlinkTransport::PeerInReach(const SegmentDescriptor& peer) const {
  return !domain_.empty() && JsonString(peer.json, kDomainField).value_or("") == domain_;
}

MC_TRANSPORT_PLUGIN("nvlink", NvlinkTransport, {"nvlink"}, /*exclusive_env=*/"", ProbeNvlink);

}  // namespace mooncake::te::nvlink
