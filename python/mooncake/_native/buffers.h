// Conversion of Python buffer arguments to addresses. Zero-copy by contract: an object that cannot be used in
// place (non-contiguous, read-only where writing, too small) raises TypeError/ValueError, never copies.
#ifndef MOONCAKE_PYTHON_NATIVE_BUFFERS_H_
#define MOONCAKE_PYTHON_NATIVE_BUFFERS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

namespace mooncake::python {

namespace nb = nanobind;

/// An int is an address (Mooncake's convention). Otherwise the object must expose contiguous CPU memory
/// (numpy array, torch CPU tensor, DLPack, buffer protocol) of at least `length` bytes; `writable` requires
/// write access. Must be called with the GIL held.
inline uintptr_t AddressOf(nb::handle obj, size_t length, bool writable, const char* what) {
  if (PyLong_Check(obj.ptr())) {
    unsigned long long v = PyLong_AsUnsignedLongLong(obj.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw nb::value_error((std::string(what) + ": address must be a non-negative integer").c_str());
    }
    return static_cast<uintptr_t>(v);
  }
  const void* data = nullptr;
  size_t nbytes = 0;
  if (writable) {
    nb::ndarray<nb::device::cpu, nb::c_contig> a;
    if (!nb::try_cast(obj, a, /*convert=*/false)) {
      throw nb::type_error((std::string(what) +
                            ": expected an int address or a writable, C-contiguous CPU array/tensor/buffer")
                               .c_str());
    }
    data = a.data();
    nbytes = a.nbytes();
  } else {
    nb::ndarray<nb::ro, nb::device::cpu, nb::c_contig> a;
    if (!nb::try_cast(obj, a, /*convert=*/false)) {
      throw nb::type_error(
          (std::string(what) + ": expected an int address or a C-contiguous CPU array/tensor/buffer").c_str());
    }
    data = a.data();
    nbytes = a.nbytes();
  }
  if (nbytes < length) {
    throw nb::value_error((std::string(what) + ": object holds " + std::to_string(nbytes) + " bytes, fewer than " +
                           std::to_string(length))
                              .c_str());
  }
  return reinterpret_cast<uintptr_t>(data);
}

}  // namespace mooncake::python

#endif  // MOONCAKE_PYTHON_NATIVE_BUFFERS_H_
