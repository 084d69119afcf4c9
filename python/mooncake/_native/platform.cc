// mooncake._native.platform: the platform layer (transfer_engine/platform/platform.h) from Python: which
// accelerator platforms this process has and why the others are unusable, what kind of memory an address is,
// and a platform's allocate / free / IPC / copy calls (tests drive the host emulation through them).
// Errors: ValueError (kInvalidArgument), NotImplementedError (kNotImplemented), RuntimeError (anything else);
// wrong argument types: TypeError.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <string>

#include "transfer_engine/common/checked_copy.h"
#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"
#include "transfer_engine/platform/platform.h"
#include "transfer_engine/plugin/loader.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mooncake::python {
namespace {

[[noreturn]] void Raise(const te::Status& st) {
  PyObject* type = st.code() == te::ErrorCode::kInvalidArgument   ? PyExc_ValueError
                   : st.code() == te::ErrorCode::kNotImplemented ? PyExc_NotImplementedError
                                                                  : PyExc_RuntimeError;
  PyErr_SetString(type, st.ToString().c_str());
  throw nb::python_error();
}

template <typename T>
T Take(te::StatusOr<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}

void Check(const te::Status& st) {
  if (!st.ok()) Raise(st);
}

// Runs `fn` without the GIL; its result is turned into a value or an exception after the GIL is back.
template <typename Fn>
auto Released(Fn fn) {
  nb::gil_scoped_release release;
  return fn();
}

te::AllocationKind ParseKind(const std::string& kind) {
  if (kind == "device") return te::AllocationKind::kDevice;
  if (kind == "pinned_host") return te::AllocationKind::kPinnedHost;
  if (kind == "shareable") return te::AllocationKind::kShareable;
  throw nb::value_error(("kind must be 'device', 'pinned_host' or 'shareable', not '" + kind + "'").c_str());
}

nb::dict ProbeDict(te::Platform& p) {
  te::PlatformProbe probe;
  {
    nb::gil_scoped_release release;  // a first probe loads the vendor library
    probe = p.Probe();
  }
  nb::dict d;
  d["name"] = p.name();
  d["memory_type"] = te::MemoryTypeName(p.device_type());
  d["usable"] = probe.usable;
  d["reason"] = probe.reason;
  d["device_count"] = probe.device_count;
  return d;
}

void* Ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// A range the registry does not claim as device memory is host memory of this process: it must be mapped
// (as the cpu platform copies with memmove), so a bad address is a ValueError, not a crash.
void CheckHostSide(uintptr_t p, size_t n, const char* what) {
  if (te::PlatformRegistry::Get().Classify(Ptr(p)).is_device()) return;
  Check(te::CheckMapped(Ptr(p), n, what));
}

}  // namespace

void RegisterPlatform(nb::module_& m) {
  nb::class_<te::Platform>(m, "Platform",
                           "One platform of this process (see platforms()); obtained with get(name). Addresses are "
                           "ints.")
      .def_prop_ro("name", &te::Platform::name)
      .def_prop_ro("memory_type", [](te::Platform& p) { return std::string(te::MemoryTypeName(p.device_type())); })
      .def("probe", &ProbeDict, "{name, memory_type, usable, reason, device_count}.")
      .def("classify", [](te::Platform& p, uintptr_t ptr) -> std::optional<std::string> {
        std::optional<te::MemoryKind> k = p.Classify(Ptr(ptr));
        if (!k) return std::nullopt;
        return k->ToString();
      }, "ptr"_a, "'cuda:0', 'host' (its pinned memory), or None when the address is not this platform's.")
      .def("allocate", [](te::Platform& p, size_t size, const std::string& kind, int device) {
        te::AllocationKind k = ParseKind(kind);
        return reinterpret_cast<uintptr_t>(Take(Released([&] { return p.Allocate(size, k, device); })));
      }, "size"_a, "kind"_a = "device", "device"_a = 0,
      "Allocates `size` bytes: kind 'device', 'pinned_host' or 'shareable' (exportable VMM memory); the address.")
      .def("free", [](te::Platform& p, uintptr_t ptr, size_t size, const std::string& kind) {
        te::AllocationKind k = ParseKind(kind);
        Check(Released([&] { return p.Free(Ptr(ptr), size, k); }));
      }, "ptr"_a, "size"_a, "kind"_a = "device", "Frees what allocate returned (same size and kind).")
      .def("export_ipc", [](te::Platform& p, uintptr_t ptr, size_t size) {
        return Take(Released([&] { return p.ExportIpc(Ptr(ptr), size); }));
      }, "ptr"_a, "size"_a, "A handle (str) another process of this host passes to import_ipc.")
      .def("import_ipc", [](te::Platform& p, const std::string& handle, int owner_pid, size_t size) {
        return reinterpret_cast<uintptr_t>(Take(Released([&] { return p.ImportIpc(handle, owner_pid, size); })));
      }, "handle"_a, "owner_pid"_a, "size"_a, "Maps a handle of process owner_pid; the local address.")
      .def("close_ipc", [](te::Platform& p, uintptr_t ptr, size_t size) {
        Check(Released([&] { return p.CloseIpc(Ptr(ptr), size); }));
      }, "ptr"_a, "size"_a, "Undoes one import_ipc.")
      .def("copy", [](te::Platform& p, uintptr_t dst, uintptr_t src, size_t size, int device, uintptr_t stream,
                      bool wait) {
        CheckHostSide(dst, size, "destination");
        CheckHostSide(src, size, "source");
        Check(Released([&] {
          te::StatusOr<std::unique_ptr<te::CopyCompletion>> c =
              p.CopyAsync(Ptr(dst), Ptr(src), size, device, Ptr(stream));
          if (!c.ok()) return c.status();
          return wait ? (*c)->Wait() : te::Status::Ok();
        }));
      }, "dst"_a, "src"_a, "size"_a, "device"_a = -1, "stream"_a = 0, "wait"_a = true,
      "Copies `size` bytes (host or this platform's device memory on either side) for `device` (-1: the device\n"
      "side's). stream: the platform's native stream handle as an int (a CUstream such as\n"
      "torch.cuda.current_stream().cuda_stream; CUDA's legacy default stream, handle 0 in torch, is\n"
      "CU_STREAM_LEGACY = 1), 0 = the platform's own stream; cpu and host_emulation have none and accept only 0.\n"
      "wait=True waits for the copy and raises its error; wait=False returns once it is enqueued: it is then\n"
      "ordered by its stream (host_emulation: after every copy submitted before it), both ranges must stay valid\n"
      "until it has run, and its later errors are not reported here (CUDA reports them on the stream, e.g. at the\n"
      "next synchronize). Errors found when starting it are raised either way.");

  m.def("platforms", [] {
    {
      nb::gil_scoped_release release;
      te::LoadPlugins();  // platform plugins join the registry
    }
    nb::list out;
    for (const auto& p : te::PlatformRegistry::Get().All()) out.append(ProbeDict(*p));
    return out;
  }, "Every platform of this process, 'cpu' first: a list of {name, memory_type, usable, reason, device_count}\n"
     "dicts (reason says why an unusable one cannot run here). Loads the platform plugins on first use.");

  m.def("get", [](const std::string& name) {
    std::shared_ptr<te::Platform> p = te::PlatformRegistry::Get().Find(name);
    if (p == nullptr) {
      {
        nb::gil_scoped_release release;
        te::LoadPlugins();
      }
      p = te::PlatformRegistry::Get().Find(name);
    }
    if (p == nullptr) throw nb::key_error(("no platform named '" + name + "' (see platforms())").c_str());
    return p;
  }, "name"_a, "The platform named `name` ('cpu', 'cuda', 'host_emulation', ...); KeyError when none.");

  m.def("classify", [](uintptr_t ptr) { return te::PlatformRegistry::Get().Classify(Ptr(ptr)).ToString(); },
        "ptr"_a, "The memory kind of an address: 'cuda:0', 'rocm:1', ... or 'host' when no device platform claims it.");

  m.def("enable_host_emulation", [](int device_count) {
    if (device_count < 1) throw nb::value_error("device_count must be >= 1");
    te::PlatformRegistry::Get().Register(te::MakeHostEmulationPlatform(device_count));
  }, "device_count"_a = 2,
  "TESTS ONLY: registers an enabled host EMULATION of `device_count` CUDA devices (memfd-backed host memory)\n"
  "as 'host_emulation', replacing the registered one (which MC_PLATFORM_EMULATION=1 enables at start-up).\n"
  "Memory it allocates classifies as 'cuda:N'. It is not a GPU.");
}

}  // namespace mooncake::python
