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
  "NIC priority matrix ({\"cpu:N\": [[preferred], [available]]}) and NIC details, as JSON.");
}

}  // namespace mooncake::python
