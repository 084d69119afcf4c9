#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_CONFIG_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "transfer_engine/transport/options.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::cxl {

/// The CXL transport's settings: option "cxl.<key>" of EngineOptions::transport_options, else the MC_CXL_*
/// variable (Mooncake's names where it has one), else the default. Plain value type.
struct CxlConfig {
  std::string dev_path;           ///< dev_path / MC_CXL_DEV_PATH: /dev/daxX.Y or any file every engine maps
  uint64_t dev_size = 0;          ///< dev_size / MC_CXL_DEV_SIZE: bytes to map (0: the file's or the DAX size)
  bool flush = true;              ///< flush / MC_CXL_FLUSH: cache write-back / invalidation around copies
  size_t slice_size = 16 << 20;   ///< slice_size / MC_CXL_SLICE_SIZE
  int threads = 1;                ///< threads / MC_CXL_THREADS: workers copying asynchronous batches

  static CxlConfig From(const TransportOptions& options);
};

/// The plugin's probe: usable only when a device is configured (MC_CXL_DEV_PATH names a path this process can
/// open read-write). A probe sees no engine options, so the variable is what enables the transport; the
/// "cxl.dev_path" option then may name another device for one engine.
TransportProbe ProbeCxl();

}  // namespace mooncake::te::cxl

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CXL_CXL_CONFIG_H_
