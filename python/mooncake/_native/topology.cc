// mooncake._native topology helpers: the host's NICs as the Transfer Engine sees them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "transfer_engine/api/engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mooncake::python {

void RegisterTopology(nb::module_& m) {
  m.def("local_topology", [](const std::string& device_filter) {
    return te::TransferEngine::LocalTopologyJson(device_filter);
  }, "device_filter"_a = "",
  "NIC priority matrix ({\"cpu:N\": [[preferred], [available]]}), as JSON.");
  m.def("local_host", [](const std::string& device_filter) {
    return te::TransferEngine::LocalHostJson(device_filter);
  }, "device_filter"_a = "", "NICs (address, NUMA node, speed), NUMA nodes with their CPUs and the host id, as JSON.");
}

}  // namespace mooncake::python
