#include "transfer_engine/platform/testing/stalling_page.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace mooncake::te::testing {

StallingPage::StallingPage() : size_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
  fd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd_ < 0) {
    why_ = std::string("userfaultfd: ") + strerror(errno);
    // Without CAP_SYS_PTRACE (a sandbox's user namespace): the device node, governed by its file permissions.
    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev < 0) {
      why_ += std::string("; /dev/userfaultfd: ") + strerror(errno);
      return;
    }
    fd_ = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) why_ += std::string("; USERFAULTFD_IOC_NEW: ") + strerror(errno);
    close(dev);
    if (fd_ < 0) return;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  if (ioctl(fd_, UFFDIO_API, &api) != 0) {
    why_ = std::string("UFFDIO_API: ") + strerror(errno);
    close(fd_);
    fd_ = -1;
    return;
  }
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    why_ = std::string("mmap: ") + strerror(errno);
    return;
  }
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uintptr_t>(p);
  reg.range.len = size_;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (ioctl(fd_, UFFDIO_REGISTER, &reg) != 0) {
    why_ = std::string("UFFDIO_REGISTER: ") + strerror(errno);
    munmap(p, size_);
    return;
  }
  addr_ = p;
}

StallingPage::~StallingPage() {
  if (ok() && !released_) Release(0);
  if (addr_ != nullptr) munmap(addr_, size_);
  if (fd_ >= 0) close(fd_);
}

bool StallingPage::WaitForToucher(int timeout_ms) {
  if (!ok()) return false;
  pollfd pfd{fd_, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) != 1) return false;
  uffd_msg msg{};
  return read(fd_, &msg, sizeof(msg)) == static_cast<ssize_t>(sizeof(msg)) && msg.event == UFFD_EVENT_PAGEFAULT;
}

bool StallingPage::Release(unsigned char byte) {
  if (!ok() || released_) return false;
  released_ = true;
  std::vector<unsigned char> fill(size_, byte);
  uffdio_copy copy{};
  copy.dst = reinterpret_cast<uintptr_t>(addr_);
  copy.src = reinterpret_cast<uintptr_t>(fill.data());
  copy.len = size_;
  return ioctl(fd_, UFFDIO_COPY, &copy) == 0;
}

}  // namespace mooncake::te::testing
