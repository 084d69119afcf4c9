// The single native extension `mooncake._native`; each concept registers itself from its own file.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace mooncake::python {
void RegisterEngine(nb::module_& m);
void RegisterBench(nb::module_& m);
void RegisterTopology(nb::module_& m);
void RegisterPlugins(nb::module_& m);
void RegisterPlatform(nb::module_& m);
}  // namespace mooncake::python

NB_MODULE(_native, m) {
  m.doc() = "Native core of mooncake (Transfer Engine bindings).";
  mooncake::python::RegisterEngine(m);
  mooncake::python::RegisterTopology(m);
  mooncake::python::RegisterPlugins(m);
  nb::module_ platform = m.def_submodule("platform", "The platform layer: accelerators, memory kinds, IPC, copies.");
  mooncake::python::RegisterPlatform(platform);
  nb::module_ bench = m.def_submodule("bench", "Yardsticks for transfer_engine_bench (raw socket, memcpy).");
  mooncake::python::RegisterBench(bench);
  // Accelerator support compiled into this build (CPU-only wheel: all false).
  m.attr("SUPPORT_CUDA") = false;
  m.attr("SUPPORT_EFA") = false;
  m.attr("SUPPORT_HIP") = false;
  m.attr("SUPPORT_MNNVL") = false;
  m.attr("SUPPORT_MUSA") = false;
  m.attr("SUPPORT_INTRA_NVLINK") = false;
}
