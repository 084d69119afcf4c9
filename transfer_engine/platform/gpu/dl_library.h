#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_DL_LIBRARY_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_DL_LIBRARY_H_

#include <string>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te::gpu {

/// A vendor library opened with dlopen (RTLD_NOW | RTLD_LOCAL) and never closed, and typed dlsym on it.
class DlLibrary {
 public:
  /// The first of `sonames` that loads. On failure kDeviceNotFound: "<pattern>: not found (<dlerror of the first
  /// soname>)", e.g. "libamdhip64.so.*: not found (libamdhip64.so.7: cannot open shared object file: No such
  /// file or directory)".
  static StatusOr<DlLibrary> Open(const std::vector<std::string>& sonames, const std::string& pattern);

  const std::string& soname() const { return soname_; }

  /// Sets `fn` to the first of `symbols` the library exports; false (fn null) when none.
  template <typename Fn>
  bool Resolve(Fn* fn, std::initializer_list<const char*> symbols) const {
    *fn = reinterpret_cast<Fn>(Find(symbols));
    return *fn != nullptr;
  }

  /// The same, recording the first missing name in `missing` (when it is still empty).
  template <typename Fn>
  void Require(Fn* fn, std::initializer_list<const char*> symbols, std::string* missing) const {
    if (!Resolve(fn, symbols) && missing->empty()) missing->assign(*symbols.begin());
  }

 private:
  void* Find(std::initializer_list<const char*> symbols) const;
  void* handle_ = nullptr;
  std::string soname_;
};

}  // namespace mooncake::te::gpu

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_GPU_DL_LIBRARY_H_
