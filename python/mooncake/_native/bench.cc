// mooncake._native bench helpers: the raw-socket and memcpy yardsticks of transfer_engine_bench.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <optional>
#include <stdexcept>

#include "transfer_engine/bench/baseline.h"
#include "transfer_engine/compat/compat_engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mooncake::python {

void RegisterBench(nb::module_& m) {
  using te::bench::RawSocketClient;
  using te::bench::RawSocketServer;
  nb::class_<RawSocketServer>(m, "RawSocketServer")
      .def(nb::init<>())
      .def("start", [](RawSocketServer& s, const std::string& ip) {
        auto port = s.Start(ip);
        if (!port.ok()) throw std::runtime_error(port.status().ToString());
        return *port;
      }, "ip"_a = "127.0.0.1")
      .def("stop", &RawSocketServer::Stop, nb::call_guard<nb::gil_scoped_release>());
  nb::class_<RawSocketClient>(m, "RawSocketClient")
      .def(nb::init<>())
      .def("connect", [](RawSocketClient& c, const std::string& host, uint16_t port) {
        te::Status st = c.Connect(host, port);
        if (!st.ok()) throw std::runtime_error(st.ToString());
      }, "host"_a, "port"_a)
      .def("timed", [](RawSocketClient& c, bool write, uintptr_t buf, size_t len, size_t count, int iters) {
        // Latency of each of `iters` operations (each = `count` pipelined requests), in seconds.
        std::vector<double> out;
        nb::gil_scoped_release r;
        for (int i = 0; i < iters; ++i) {
          auto t0 = std::chrono::steady_clock::now();
          te::Status st = write ? c.Write(reinterpret_cast<const char*>(buf), len, count)
                                : c.Read(reinterpret_cast<char*>(buf), len, count);
          if (!st.ok()) {
            nb::gil_scoped_acquire a;
            throw std::runtime_error(st.ToString());
          }
          out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return out;
      }, "write"_a, "buffer"_a, "length"_a, "count"_a, "iters"_a);
  m.def("time_engine", [](te::CompatEngine& e, bool write, const std::string& target, uintptr_t buffer, uint64_t peer,
                          size_t len, size_t count, int iters) {
    // The engine's side of the comparison, timed like RawSocketClient.timed: a C++ loop of `iters` synchronous
    // operations (each `count` requests of `len` bytes, back to back in memory), no interpreter in between.
    std::vector<uintptr_t> buffers;
    std::vector<uint64_t> peers;
    for (size_t i = 0; i < count; ++i) {
      buffers.push_back(buffer + i * len);
      peers.push_back(peer + i * len);
    }
    const std::vector<size_t> lengths(count, len);
    const te::OpCode op = write ? te::OpCode::kWrite : te::OpCode::kRead;
    std::vector<double> out;
    nb::gil_scoped_release r;
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      int rc = count == 1 ? e.TransferSync(target, buffer, peer, len, op, std::nullopt)
                          : e.BatchTransferSync(target, buffers, peers, lengths, op, std::nullopt);
      if (rc != 0) {
        nb::gil_scoped_acquire a;
        throw std::runtime_error("transfer failed with " + std::to_string(rc) + " (see the log above)");
      }
      out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return out;
  }, "engine"_a, "write"_a, "target"_a, "buffer"_a, "peer"_a, "length"_a, "count"_a, "iters"_a);
  m.def("memcpy_bandwidth", [](uintptr_t dst, uintptr_t src, size_t len, int iters) {
    nb::gil_scoped_release r;
    return te::bench::MemcpyBandwidth(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), len, iters);
  }, "dst"_a, "src"_a, "length"_a, "iters"_a, "Single-core memcpy bandwidth in GB/s.");
}

}  // namespace mooncake::python
