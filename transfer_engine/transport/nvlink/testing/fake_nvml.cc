// A FAKE NVML (libnvidia-ml) for nvlink's tests on machines without a GPU: a shared library exporting the five
// entry points nvml_domain.cc resolves, with NVML's C ABI as its API reference documents it. It is not NVML; it
// checks the caller's discipline as NVML would (nvmlInit_v2 before any device call, a handle it gave out).
//
// Devices: the PCI addresses the fake CUDA driver reports (0000:3b:00.0, 0000:3c:00.0, ...: FAKE_NVML_DEVICES,
// default 2); others answer NVML_ERROR_NOT_FOUND. Fabric information (environment, read at each call):
// FAKE_NVML_FABRIC_STATE (default 3, COMPLETED), FAKE_NVML_FABRIC_STATUS (default 0), FAKE_NVML_CLUSTER_UUID
// (32 hex digits, default 00112233445566778899aabbccddeeff), FAKE_NVML_CLIQUE (default 7; FAKE_NVML_CLIQUES,
// comma-separated, gives device i the i-th entry), FAKE_NVML_INIT_RESULT (nvmlInit_v2's result, default 0).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr int kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kNotFound = 6;

struct FabricInfo {  // nvmlGpuFabricInfo_t
  unsigned char cluster_uuid[16];
  int status;
  unsigned int clique_id;
  unsigned char state;
};

std::mutex mu;
int inits = 0;      // nvmlInit_v2 calls not yet shut down
int devices[64];    // the handles: &devices[i] is device i

int EnvInt(const char* name, int fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? atoi(v) : fallback;
}

}  // namespace

#define FAKE_NVML_API extern "C" __attribute__((visibility("default")))

FAKE_NVML_API int nvmlInit_v2() {
  const int r = EnvInt("FAKE_NVML_INIT_RESULT", 0);
  if (r != kSuccess) return r;
  std::lock_guard<std::mutex> lock(mu);
  ++inits;
  return kSuccess;
}

FAKE_NVML_API int nvmlShutdown() {
  std::lock_guard<std::mutex> lock(mu);
  if (inits == 0) return kUninitialized;
  --inits;
  return kSuccess;
}

FAKE_NVML_API const char* nvmlErrorString(int r) {
  switch (r) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case kNotFound: return "Not Found";
    default: return "Unknown Error (fake NVML)";
  }
}

FAKE_NVML_API int nvmlDeviceGetHandleByPciBusId_v2(const char* pci_bus_id, void** device) {
  std::lock_guard<std::mutex> lock(mu);
  if (inits == 0) return kUninitialized;
  if (pci_bus_id == nullptr || device == nullptr) return kInvalidArgument;
  const int count = EnvInt("FAKE_NVML_DEVICES", 2);
  for (int i = 0; i < count && i < 64; ++i) {
    char id[16];
    snprintf(id, sizeof(id), "0000:%02x:00.0", 0x3b + i);
    if (strcasecmp(id, pci_bus_id) == 0) {
      *device = &devices[i];
      return kSuccess;
    }
  }
  return kNotFound;
}

FAKE_NVML_API int nvmlDeviceGetGpuFabricInfo(void* device, FabricInfo* info) {
  std::lock_guard<std::mutex> lock(mu);
  if (inits == 0) return kUninitialized;
  if (device < static_cast<void*>(&devices[0]) || device >= static_cast<void*>(&devices[64]) || info == nullptr) {
    return kInvalidArgument;
  }
  const char* uuid = getenv("FAKE_NVML_CLUSTER_UUID");
  const std::string hex = uuid != nullptr ? uuid : "00112233445566778899aabbccddeeff";
  if (hex.size() != 32) return kInvalidArgument;
  for (int i = 0; i < 16; ++i) {
    if (sscanf(hex.c_str() + 2 * i, "%2hhx", &info->cluster_uuid[i]) != 1) return kInvalidArgument;
  }
  info->status = EnvInt("FAKE_NVML_FABRIC_STATUS", 0);
  info->clique_id = static_cast<unsigned int>(EnvInt("FAKE_NVML_CLIQUE", 7));
  if (const char* per_device = getenv("FAKE_NVML_CLIQUES")) {
    const char* at = per_device;
    for (long i = static_cast<int*>(device) - &devices[0]; i > 0 && at != nullptr; --i) {
      at = strchr(at, ',');
      if (at != nullptr) ++at;
    }
    if (at != nullptr && *at != '\0' && *at != ',') info->clique_id = static_cast<unsigned int>(atoi(at));
  }
  info->state = static_cast<unsigned char>(EnvInt("FAKE_NVML_FABRIC_STATE", 3));
  return kSuccess;
}
