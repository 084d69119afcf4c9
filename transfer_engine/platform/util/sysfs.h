#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_SYSFS_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_SYSFS_H_

#include <string>

namespace mooncake::te::platform_util {

/// The NUMA node a sysfs numa_node file (e.g. /sys/bus/pci/devices/0000:3b:00.0/numa_node) names: a decimal
/// node >= 0; -1 when the file is missing, unreadable, negative (the kernel writes -1 for "no node") or not a
/// number. Never throws; thread-safe.
int ReadNumaNode(const std::string& path);

}  // namespace mooncake::te::platform_util

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_UTIL_SYSFS_H_
