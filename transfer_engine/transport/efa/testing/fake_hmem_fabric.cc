#include "transfer_engine/transport/efa/testing/fake_hmem_fabric.h"

#include <rdma/fabric.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace mooncake::te::efa::testing {
namespace {

// The real entry points and ops tables the fake forwards to. One provider's tables (every fabric and domain
// of a provider shares them): the fake serves one provider per process.
struct State {
  std::mutex mu;
  const FabricApi* real = nullptr;
  FabricApi fake{};
  fi_ops_fabric real_fabric{}, fake_fabric{};
  fi_ops_domain real_domain{}, fake_domain{};
  fi_ops_mr real_mr{}, fake_mr{};
  bool fabric_saved = false, domain_saved = false;
  std::vector<FakeHmemRegistration> registrations;
  std::vector<struct fi_info*> kept;  // infos handed to the provider, alive until exit
};

State& S() {
  static State* s = new State();  // never destroyed: providers may run at exit
  return *s;
}

template <typename Ops>
void Copy(Ops* dst, const Ops* src) {
  std::memset(dst, 0, sizeof(Ops));
  std::memcpy(dst, src, std::min(sizeof(Ops), src->size));
}

// `info` without the fake's marks, kept alive for the provider.
struct fi_info* Unmarked(const struct fi_info* info) {
  struct fi_info* copy = S().real->dupinfo(info);
  if (copy == nullptr) return nullptr;
  copy->caps &= ~FI_HMEM;
  if (copy->tx_attr) copy->tx_attr->caps &= ~FI_HMEM;
  if (copy->rx_attr) copy->rx_attr->caps &= ~FI_HMEM;
  if (copy->domain_attr) copy->domain_attr->mr_mode &= ~FI_MR_HMEM;
  std::lock_guard lock(S().mu);
  S().kept.push_back(copy);
  return copy;
}

int FakeRegattr(struct fid* fid, const struct fi_mr_attr* attr, uint64_t flags, struct fid_mr** mr) {
  if (attr == nullptr) return -FI_EINVAL;
  struct fi_mr_attr host = *attr;
  {
    std::lock_guard lock(S().mu);
    FakeHmemRegistration r;
    r.iface = attr->iface;
    r.device = attr->iface == FI_HMEM_CUDA ? static_cast<uint64_t>(attr->device.cuda) : attr->device.reserved;
    if (attr->mr_iov && attr->iov_count > 0) {
      r.addr = attr->mr_iov[0].iov_base;
      r.length = attr->mr_iov[0].iov_len;
    }
    S().registrations.push_back(r);
  }
  host.iface = FI_HMEM_SYSTEM;
  host.device.reserved = 0;
  return S().real_mr.regattr(fid, &host, flags, mr);
}

int FakeEndpoint(struct fid_domain* domain, struct fi_info* info, struct fid_ep** ep, void* context) {
  struct fi_info* plain = Unmarked(info);
  if (plain == nullptr) return -FI_ENOMEM;
  return S().real_domain.endpoint(domain, plain, ep, context);
}

int FakeDomain(struct fid_fabric* fabric, struct fi_info* info, struct fid_domain** domain, void* context) {
  struct fi_info* plain = Unmarked(info);
  if (plain == nullptr) return -FI_ENOMEM;
  int rc = S().real_fabric.domain(fabric, plain, domain, context);
  if (rc != 0) return rc;
  std::lock_guard lock(S().mu);
  if (!S().domain_saved) {
    Copy(&S().real_domain, (*domain)->ops);
    Copy(&S().fake_domain, (*domain)->ops);
    S().fake_domain.endpoint = FakeEndpoint;
    Copy(&S().real_mr, (*domain)->mr);
    Copy(&S().fake_mr, (*domain)->mr);
    S().fake_mr.regattr = FakeRegattr;
    S().domain_saved = true;
  }
  (*domain)->ops = &S().fake_domain;
  (*domain)->mr = &S().fake_mr;
  return 0;
}

int FakeFabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context) {
  int rc = S().real->fabric(attr, fabric, context);
  if (rc != 0) return rc;
  std::lock_guard lock(S().mu);
  if (!S().fabric_saved) {
    Copy(&S().real_fabric, (*fabric)->ops);
    Copy(&S().fake_fabric, (*fabric)->ops);
    S().fake_fabric.domain = FakeDomain;
    S().fabric_saved = true;
  }
  (*fabric)->ops = &S().fake_fabric;
  return 0;
}

int FakeGetinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
                const struct fi_info* hints, struct fi_info** info) {
  const bool hmem = hints != nullptr && (hints->caps & FI_HMEM) != 0;
  if (!hmem) return S().real->getinfo(version, node, service, flags, hints, info);
  struct fi_info* plain = S().real->dupinfo(hints);
  if (plain == nullptr) return -FI_ENOMEM;
  plain->caps &= ~FI_HMEM;
  if (plain->domain_attr) plain->domain_attr->mr_mode &= ~FI_MR_HMEM;
  int rc = S().real->getinfo(version, node, service, flags, plain, info);
  S().real->freeinfo(plain);
  if (rc != 0) return rc;
  for (struct fi_info* i = *info; i != nullptr; i = i->next) {
    i->caps |= FI_HMEM;
    if (i->domain_attr) i->domain_attr->mr_mode |= FI_MR_HMEM;
  }
  return 0;
}

}  // namespace

StatusOr<const FabricApi*> FakeHmemFabricApi() {
  auto real = LoadFabricApi();
  if (!real.ok()) return real.status();
  State& s = S();
  std::lock_guard lock(s.mu);
  if (s.real == nullptr) {
    s.real = *real;
    s.fake = **real;
    s.fake.getinfo = FakeGetinfo;
    s.fake.fabric = FakeFabric;
  }
  return &s.fake;
}

std::vector<FakeHmemRegistration> FakeHmemRegistrations() {
  std::lock_guard lock(S().mu);
  return S().registrations;
}

}  // namespace mooncake::te::efa::testing
