// mooncake.engine bindings: TransferEngine (Mooncake's API; positional and keyword arguments),
// TransferOpcode, TransferNotify, InnerTransferEngine. No logic here beyond argument conversion: the
// behaviour lives in transfer_engine/compat.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "python/mooncake/_native/buffers.h"
#include "transfer_engine/common/checked_copy.h"
#include "transfer_engine/compat/compat_engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mooncake::python {
namespace {

using te::CompatEngine;
using te::Notification;
using te::OpCode;

/// The Python-visible engine. Destruction unpublishes the segment over the network: it runs without the GIL,
/// so a metadata server living in the same Python process can still answer.
struct PyTransferEngine : CompatEngine {
  ~PyTransferEngine() {
#if PY_VERSION_HEX >= 0x030D0000
    bool finalizing = Py_IsFinalizing();
#else
    bool finalizing = _Py_IsFinalizing();
#endif
    if (initialized() && !finalizing) {
      nb::gil_scoped_release release;
      Close();
    }
  }
};

/// Opaque handle to the C++ engine, for other components (the Store) to share one engine. It holds the Python
/// engine it came from (`owner`), so the engine stays alive while a handle does.
struct InnerTransferEngine {
  te::TransferEngine* engine = nullptr;
  nb::object owner;
};

std::vector<uintptr_t> Addresses(const nb::sequence& objs, const std::vector<size_t>& lengths, bool writable) {
  std::vector<uintptr_t> out;
  size_t i = 0;
  for (nb::handle h : objs) {
    size_t len = i < lengths.size() ? lengths[i] : 0;
    out.push_back(AddressOf(h, len, writable, "buffers"));
    ++i;
  }
  return out;
}

// write_bytes_to_buffer / read_bytes_from_buffer: plain copies on any address of this process (registered or
// not, as in Mooncake), made by the kernel so that an unmapped or protected address is a ValueError, never a
// crash. The copy runs without the GIL.
int WriteBytes(uintptr_t dest, nb::bytes src, size_t length) {
  if (length > src.size()) throw nb::value_error("length exceeds the bytes given");
  te::Status st;
  {
    nb::gil_scoped_release r;
    st = te::CheckedCopy(reinterpret_cast<void*>(dest), src.c_str(), length);
  }
  if (!st.ok()) throw nb::value_error(("write_bytes_to_buffer: " + st.message()).c_str());
  return 0;
}

nb::bytes ReadBytes(uintptr_t src, size_t length) {
  const void* from = reinterpret_cast<const void*>(src);
  te::Status st = length > static_cast<size_t>(PY_SSIZE_T_MAX) ? te::InvalidArgument("length is too large")
                                                                : te::CheckMapped(from, length, "source");
  if (!st.ok()) throw nb::value_error(("read_bytes_from_buffer: " + st.message()).c_str());
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length));
  if (!out) throw nb::python_error();
  {
    nb::gil_scoped_release r;
    st = te::CheckedCopy(PyBytes_AS_STRING(out), from, length);
  }
  if (!st.ok()) {
    Py_DECREF(out);
    throw nb::value_error(("read_bytes_from_buffer: " + st.message()).c_str());
  }
  return nb::steal<nb::bytes>(out);
}

std::optional<Notification> ToNotification(nb::handle notify) {
  if (notify.is_none()) return std::nullopt;
  return nb::cast<Notification>(notify);
}

// The transfer entry points. Arguments are converted with the GIL held; the transfer runs without it.
// transport_hint is accepted for compatibility: the engine picks the transport per request itself.
int SyncOne(CompatEngine& e, const std::string& target, nb::handle buffer, uint64_t peer, size_t length, OpCode op,
            nb::handle notify, const std::string& /*transport_hint*/) {
  uintptr_t addr = AddressOf(buffer, length, op == OpCode::kRead, "buffer");
  auto n = ToNotification(notify);
  nb::gil_scoped_release r;
  return e.TransferSync(target, addr, peer, length, op, n);
}

int SyncBatch(CompatEngine& e, const std::string& target, nb::sequence buffers, std::vector<uint64_t> peers,
              std::vector<size_t> lengths, OpCode op, nb::handle notify, const std::string& /*transport_hint*/) {
  auto addrs = Addresses(buffers, lengths, op == OpCode::kRead);
  auto n = ToNotification(notify);
  nb::gil_scoped_release r;
  return e.BatchTransferSync(target, addrs, peers, lengths, op, n);
}

uint64_t AsyncBatch(CompatEngine& e, const std::string& target, nb::sequence buffers, std::vector<uint64_t> peers,
                    std::vector<size_t> lengths, OpCode op, const std::string& /*transport_hint*/) {
  auto addrs = Addresses(buffers, lengths, op == OpCode::kRead);
  nb::gil_scoped_release r;
  return e.BatchTransferAsync(target, addrs, peers, lengths, op);
}

}  // namespace

void RegisterEngine(nb::module_& m) {
  nb::enum_<OpCode>(m, "TransferOpcode")
      .value("Read", OpCode::kRead)
      .value("Write", OpCode::kWrite)
      .export_values();

  nb::class_<Notification>(m, "TransferNotify")
      .def(nb::init<>())
      .def("__init__", [](Notification* n, std::string name, std::string msg) {
        new (n) Notification{std::move(name), std::move(msg)};
      }, "name"_a, "msg"_a)
      .def_rw("name", &Notification::name)
      .def_rw("msg", &Notification::message)
      .def("__repr__", [](const Notification& n) { return "TransferNotify(name=" + n.name + ", msg=" + n.message + ")"; });

  nb::class_<InnerTransferEngine>(m, "InnerTransferEngine")
      .def_prop_ro("owner", [](const InnerTransferEngine& h) { return h.owner; },
                   "The TransferEngine this handle came from (its get_engine()).");

  nb::class_<CompatEngine>(m, "_EngineBase");
  auto engine = nb::class_<PyTransferEngine, CompatEngine>(m, "TransferEngine",
      "Moves bytes between registered memory of processes and hosts (Mooncake's API). Methods return 0 on\n"
      "success and a negative error code on failure; the reason is logged (MC_LOG_LEVEL).");
  engine.attr("TransferOpcode") = m.attr("TransferOpcode");
  const auto release = nb::call_guard<nb::gil_scoped_release>();
  engine.def(nb::init<>())
      .def("close", &CompatEngine::Close, release,
           "Unpublishes this segment and stops the engine's threads; later calls fail cleanly.")
      .def("initialize", &CompatEngine::Initialize, "local_hostname"_a, "metadata_server"_a, "protocol"_a = "tcp",
           "device_name"_a = "", release)
      .def("initialize_ext", &CompatEngine::InitializeExt, "local_hostname"_a, "metadata_server"_a, "protocol"_a,
           "device_name"_a, "metadata_type"_a, release)
      .def("get_rpc_port", &CompatEngine::GetRpcPort)
      .def("get_local_segment_name", &CompatEngine::SegmentName,
           "This engine's segment name (in P2PHANDSHAKE mode 'host:rpc_port').")
      .def("allocate_managed_buffer", &CompatEngine::AllocateManagedBuffer, "length"_a, "device"_a = -1, release,
           "Registered memory for transfers; 0 on failure. device: -1 the protocol's default (host memory for tcp/"
           "rdma/shm; for device transports such as nvlink_intra the configured device), >= 0 that device (device "
           "transports only).")
      .def("free_managed_buffer", &CompatEngine::FreeManagedBuffer, "buffer_addr"_a, "length"_a, release)
      .def("register_memory", [](CompatEngine& e, nb::handle buffer, size_t capacity, const std::string& location) {
             uintptr_t addr = AddressOf(buffer, capacity, false, "buffer_addr");
             nb::gil_scoped_release r;
             return e.RegisterMemory(addr, capacity, location);
           }, "buffer_addr"_a, "capacity"_a, "location"_a = "*")
      .def("unregister_memory", [](CompatEngine& e, nb::handle buffer) {
             uintptr_t addr = AddressOf(buffer, 0, false, "buffer_addr");
             nb::gil_scoped_release r;
             return e.UnregisterMemory(addr);
           }, "buffer_addr"_a)
      .def("batch_register_memory", [](CompatEngine& e, nb::sequence buffers, std::vector<size_t> capacities,
                                       const std::string& location) {
             auto addrs = Addresses(buffers, capacities, false);
             nb::gil_scoped_release r;
             return e.BatchRegisterMemory(addrs, capacities, location);
           }, "buffer_addresses"_a, "capacities"_a, "location"_a = "*")
      .def("batch_unregister_memory", [](CompatEngine& e, nb::sequence buffers) {
             auto addrs = Addresses(buffers, {}, false);
             nb::gil_scoped_release r;
             return e.BatchUnregisterMemory(addrs);
           }, "buffer_addresses"_a);

  // transfer_sync / batch_transfer_sync / batch_transfer_async take the opcode; their _write/_read forms fix it.
  engine.def("transfer_sync", &SyncOne, "target_hostname"_a, "buffer"_a, "peer_buffer_address"_a, "length"_a,
             "opcode"_a, "notify"_a = nb::none(), "transport_hint"_a = "");
  engine.def("batch_transfer_sync", &SyncBatch, "target_hostname"_a, "buffers"_a, "peer_buffer_addresses"_a,
             "lengths"_a, "opcode"_a, "notify"_a = nb::none(), "transport_hint"_a = "");
  engine.def("batch_transfer_async", &AsyncBatch, "target_hostname"_a, "buffers"_a, "peer_buffer_addresses"_a,
             "lengths"_a, "opcode"_a, "transport_hint"_a = "");
  for (auto [suffix, op] : {std::pair{"write", OpCode::kWrite}, std::pair{"read", OpCode::kRead}}) {
    const std::string w(suffix);
    engine.def(("transfer_sync_" + w).c_str(),
               [op = op](CompatEngine& e, const std::string& target, nb::handle buffer, uint64_t peer,
                         size_t length, const std::string& hint) {
                 return SyncOne(e, target, buffer, peer, length, op, nb::none(), hint);
               },
               "target_hostname"_a, "buffer"_a, "peer_buffer_address"_a, "length"_a, "transport_hint"_a = "");
    engine.def(("batch_transfer_sync_" + w).c_str(),
               [op = op](CompatEngine& e, const std::string& target, nb::sequence buffers,
                         std::vector<uint64_t> peers, std::vector<size_t> lengths, const std::string& hint) {
                 return SyncBatch(e, target, buffers, std::move(peers), std::move(lengths), op, nb::none(), hint);
               },
               "target_hostname"_a, "buffers"_a, "peer_buffer_addresses"_a, "lengths"_a, "transport_hint"_a = "");
    engine.def(("batch_transfer_async_" + w).c_str(),
               [op = op](CompatEngine& e, const std::string& target, nb::sequence buffers,
                         std::vector<uint64_t> peers, std::vector<size_t> lengths, const std::string& hint) {
                 return AsyncBatch(e, target, buffers, std::move(peers), std::move(lengths), op, hint);
               },
               "target_hostname"_a, "buffers"_a, "peer_buffer_addresses"_a, "lengths"_a, "transport_hint"_a = "");
  }
  engine.def("transfer_submit_write", [](CompatEngine& e, const std::string& target, nb::handle buffer, uint64_t peer,
                                       size_t length, const std::string&) {
             uintptr_t addr = AddressOf(buffer, length, false, "buffer");
             nb::gil_scoped_release r;
             return e.BatchTransferAsync(target, {addr}, {peer}, {length}, OpCode::kWrite);
           }, "target_hostname"_a, "buffer"_a, "peer_buffer_address"_a, "length"_a, "transport_hint"_a = "")
      .def("get_batch_transfer_status", &CompatEngine::GetBatchTransferStatus, "batch_ids"_a, release)
      .def("transfer_check_status", &CompatEngine::TransferCheckStatus, "batch_id"_a, release)
      .def("get_first_buffer_address", &CompatEngine::GetFirstBufferAddress, "segment_name"_a, release)
      .def("define_segment", &CompatEngine::DefineSegment, "segment_name"_a, "descriptor_json"_a, release,
           "Makes `segment_name` resolve to a descriptor this process wrote (e.g. mooncake.file_segment's), without\n"
           "the metadata service; its paths are trusted. 0, else a negative code (-1 bad argument; malformed JSON).")
      .def("undefine_segment", &CompatEngine::UndefineSegment, "segment_name"_a, release,
           "Drops a define_segment definition; 0, else a negative code (not defined).")
      .def("get_local_topology", [](CompatEngine& e, std::optional<std::string> device_name) {
             return e.GetLocalTopology(device_name.value_or(""));
           }, "device_name"_a = nb::none())
      .def("get_notifies", &CompatEngine::GetNotifies)
      .def("send_probe", &CompatEngine::SendProbe, "peer_server_name"_a, "timeout_ms"_a = 0, release)
      .def("send_notify", &CompatEngine::SendNotify, "peer_server_name"_a, "notify"_a, release)
      .def("get_stats", &CompatEngine::StatsJson,
           "Per-peer transport counters as a JSON string (bytes, slices, errors, lanes, state).")
      .def("write_bytes_to_buffer", [](CompatEngine&, uintptr_t dest, nb::bytes src, size_t length) {
             return WriteBytes(dest, std::move(src), length);
           }, "dest_address"_a, "src_bytes"_a, "length"_a,
           "Copies `length` bytes of `src_bytes` to any writable address of this process; 0. An unmapped or\n"
           "read-only destination raises ValueError.")
      .def("read_bytes_from_buffer", [](CompatEngine&, uintptr_t src, size_t length) {
             return ReadBytes(src, length);
           }, "source_address"_a, "length"_a,
           "`length` bytes copied from any readable address of this process. An unmapped or protected source\n"
           "raises ValueError.")
      .def("warmup_efa_segment", [](CompatEngine&, const std::string&) { return 0; }, "segment_name"_a)
      .def("get_engine", [](CompatEngine& e) { return InnerTransferEngine{e.engine(), nb::find(&e)}; })
      .def("get_engine_ptr", [](CompatEngine& e) { return reinterpret_cast<uintptr_t>(e.engine()); });
}

}  // namespace mooncake::python
