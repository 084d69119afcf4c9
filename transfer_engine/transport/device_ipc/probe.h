#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_PROBE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_PROBE_H_

#include <string>
#include <vector>

#include "transfer_engine/transport/transport.h"

namespace mooncake::te::device_ipc {

/// Whether MC_PLATFORM_EMULATION=1 and the emulation presents `type` devices ("cuda": MC_PLATFORM_EMULATION_DEVICE
/// unset, empty or "cuda"; "rocm": it is "rocm").
bool EmulationPresents(const std::string& type);

/// A device-IPC plugin's probe: usable with `emulated_reason` when EmulationPresents(emulation_type); else usable
/// when one of `sonames` can be dlopen'ed ("<runtime> found (<soname>)"); else unusable with
/// "<missing>: <dlerror of the first soname> (<how to enable the emulation>)". Loads nothing for good (each
/// library opened is closed again).
TransportProbe ProbeRuntime(const std::string& emulation_type, const std::string& emulated_reason,
                            const std::vector<std::string>& sonames, const std::string& runtime,
                            const std::string& missing);

}  // namespace mooncake::te::device_ipc

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_DEVICE_IPC_PROBE_H_
