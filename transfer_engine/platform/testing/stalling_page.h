#ifndef MOONCAKE_TRANSFER_ENGINE_PLATFORM_TESTING_STALLING_PAGE_H_
#define MOONCAKE_TRANSFER_ENGINE_PLATFORM_TESTING_STALLING_PAGE_H_

#include <cstddef>
#include <string>

namespace mooncake::te::testing {

/// Tests only: one page of memory whose first access blocks the touching thread (a copy reading or writing it,
/// also inside a system call) until Release, through userfaultfd. It makes "this copy is still running"
/// deterministic. Single-threaded use by the test; the stalled thread is any.
class StallingPage {
 public:
  StallingPage();
  ~StallingPage();  // releases a stalled thread (zero-filled page) before unmapping
  StallingPage(const StallingPage&) = delete;
  StallingPage& operator=(const StallingPage&) = delete;

  /// False where userfaultfd is unavailable (no CAP_SYS_PTRACE, seccomp, old kernel); why() says why.
  bool ok() const { return fd_ >= 0 && addr_ != nullptr; }
  const std::string& why() const { return why_; }
  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return size_; }

  /// Waits up to `timeout_ms` until some thread has touched the page (and is stalled on it).
  bool WaitForToucher(int timeout_ms);
  /// Maps the page filled with `byte`, waking the stalled thread. Once only.
  bool Release(unsigned char byte);

 private:
  int fd_ = -1;
  void* addr_ = nullptr;
  size_t size_ = 0;
  bool released_ = false;
  std::string why_;
};

}  // namespace mooncake::te::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_PLATFORM_TESTING_STALLING_PAGE_H_
