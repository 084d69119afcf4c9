#include "transfer_engine/platform/platform.h"

#include <gtest/gtest.h>

#include <string>

namespace mooncake::te {
namespace {

TEST(MemoryKindTest, RoundTripsEveryKind) {
  const MemoryKind kinds[] = {
      {MemoryType::kHost, -1}, {MemoryType::kCuda, 0}, {MemoryType::kCuda, 3},  {MemoryType::kRocm, 1},
      {MemoryType::kNpu, 7},   {MemoryType::kMusa, 0}, {MemoryType::kFile, -1}, {MemoryType::kCxl, -1},
  };
  for (const MemoryKind& k : kinds) {
    auto parsed = MemoryKind::Parse(k.ToString());
    ASSERT_TRUE(parsed.ok()) << k.ToString() << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, k) << k.ToString();
  }
}

TEST(MemoryKindTest, TextForms) {
  EXPECT_EQ((MemoryKind{MemoryType::kHost, -1}).ToString(), "host");
  EXPECT_EQ((MemoryKind{MemoryType::kCuda, 3}).ToString(), "cuda:3");
  EXPECT_EQ((MemoryKind{MemoryType::kRocm, 1}).ToString(), "rocm:1");
  EXPECT_EQ((MemoryKind{MemoryType::kNpu, 0}).ToString(), "npu:0");
  EXPECT_EQ((MemoryKind{MemoryType::kMusa, 12}).ToString(), "musa:12");
  EXPECT_EQ((MemoryKind{MemoryType::kFile, -1}).ToString(), "file");
  EXPECT_EQ((MemoryKind{MemoryType::kCxl, -1}).ToString(), "cxl");
  EXPECT_EQ((MemoryKind{MemoryType::kCuda, -1}).ToString(), "cuda:-1");
  EXPECT_FALSE(MemoryKind::Parse("cuda:-1").ok());
}

TEST(MemoryKindTest, MooncakeLocationsAreHost) {
  for (const char* text : {"cpu:0", "cpu:1", "cpu", "*", "host"}) {
    auto parsed = MemoryKind::Parse(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().ToString();
    EXPECT_EQ(parsed->type, MemoryType::kHost) << text;
    EXPECT_EQ(parsed->device, -1) << text;
    EXPECT_FALSE(parsed->is_device()) << text;
    EXPECT_EQ(parsed->ToString(), "host") << text;
  }
}

TEST(MemoryKindTest, DeviceOrdinals) {
  auto k = MemoryKind::Parse("cuda:3");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->type, MemoryType::kCuda);
  EXPECT_EQ(k->device, 3);
  EXPECT_TRUE(k->is_device());
  auto big = MemoryKind::Parse("npu:123456789");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->device, 123456789);
  auto lead = MemoryKind::Parse("rocm:01");
  ASSERT_TRUE(lead.ok());
  EXPECT_EQ(lead->device, 1);
}

TEST(MemoryKindTest, BadStringsAreInvalidArgument) {
  for (const char* text : {"", "cuda", "cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:1 ", " cuda:1",
                           "CUDA:0", "gpu:0", "cuda:1:2", "cuda:1234567890", "cpu:", "cpu:a", "cpu:-1", "**",
                           "host:0", "file:0", "cxl:1", ":0", "hostx", "cuda:0x1"}) {
    auto parsed = MemoryKind::Parse(text);
    ASSERT_FALSE(parsed.ok()) << '"' << text << "\" parsed as " << parsed->ToString();
    EXPECT_EQ(parsed.status().code(), ErrorCode::kInvalidArgument) << text;
    EXPECT_NE(parsed.status().message().find("bad memory location"), std::string::npos) << text;
  }
}

TEST(MemoryKindTest, TypeNames) {
  EXPECT_STREQ(MemoryTypeName(MemoryType::kHost), "host");
  EXPECT_STREQ(MemoryTypeName(MemoryType::kCuda), "cuda");
  EXPECT_STREQ(MemoryTypeName(MemoryType::kRocm), "rocm");
  EXPECT_STREQ(MemoryTypeName(MemoryType::kNpu), "npu");
  EXPECT_STREQ(MemoryTypeName(MemoryType::kMusa), "musa");
  EXPECT_STREQ(MemoryTypeName(MemoryType::kFile), "file");
  EXPECT_STREQ(MemoryTypeName(MemoryType::kCxl), "cxl");
  EXPECT_STREQ(MemoryTypeName(static_cast<MemoryType>(200)), "unknown");
}

// A device platform that claims one address range; usable or not as the test says.
class FakeDevicePlatform final : public Platform {
 public:
  FakeDevicePlatform(std::string name, bool usable, const char* base, size_t size)
      : name_(std::move(name)), usable_(usable), base_(base), size_(size) {}
  std::string name() const override { return name_; }
  MemoryType device_type() const override { return MemoryType::kRocm; }
  PlatformProbe Probe() override { return PlatformProbe{usable_, usable_ ? "fake" : "fake: unusable", usable_}; }
  std::optional<MemoryKind> Classify(const void* ptr) override {
    auto p = static_cast<const char*>(ptr);
    if (p >= base_ && p < base_ + size_) return MemoryKind{MemoryType::kRocm, 2};
    return std::nullopt;
  }
  StatusOr<void*> Allocate(size_t, AllocationKind, int) override { return Status(ErrorCode::kNotImplemented, "x"); }
  Status Free(void*, size_t, AllocationKind) override { return Status(ErrorCode::kNotImplemented, "x"); }
  StatusOr<std::string> ExportIpc(void*, size_t) override { return Status(ErrorCode::kNotImplemented, "x"); }
  StatusOr<void*> ImportIpc(const std::string&, int, size_t) override {
    return Status(ErrorCode::kNotImplemented, "x");
  }
  Status CloseIpc(void*, size_t) override { return Status(ErrorCode::kNotImplemented, "x"); }
  StatusOr<std::unique_ptr<CopyCompletion>> CopyAsync(void*, const void*, size_t, int, void* stream) override {
    last_stream = stream;
    return Status(ErrorCode::kNotImplemented, "x");
  }

  void* last_stream = reinterpret_cast<void*>(1);  // the stream of the last CopyAsync

 private:
  std::string name_;
  bool usable_;
  const char* base_;
  size_t size_;
};

TEST(PlatformRegistryTest, CpuIsAlwaysPresentAndFirst) {
  auto& reg = PlatformRegistry::Get();
  auto cpu = reg.Find("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->device_type(), MemoryType::kHost);
  EXPECT_TRUE(cpu->Probe().usable);
  EXPECT_EQ(reg.All().front(), cpu);
  EXPECT_EQ(reg.ForType(MemoryType::kHost), cpu);
  EXPECT_FALSE(reg.Unregister("cpu"));
  EXPECT_EQ(reg.Find("cpu"), cpu);
  EXPECT_EQ(reg.Find("no-such-platform"), nullptr);
}

TEST(PlatformRegistryTest, ClassifyAsksUsableDevicePlatforms) {
  auto& reg = PlatformRegistry::Get();
  static char device_range[256];
  static char unusable_range[256];
  reg.Register(std::make_shared<FakeDevicePlatform>("fake_usable", true, device_range, sizeof(device_range)));
  reg.Register(std::make_shared<FakeDevicePlatform>("fake_unusable", false, unusable_range, sizeof(unusable_range)));

  EXPECT_EQ(reg.Classify(device_range + 10).ToString(), "rocm:2");
  EXPECT_EQ(reg.Classify(unusable_range).ToString(), "host");  // its platform is not usable
  int on_stack = 0;
  EXPECT_EQ(reg.Classify(&on_stack).ToString(), "host");
  EXPECT_EQ(reg.Classify(nullptr).ToString(), "host");
  ASSERT_NE(reg.ForType(MemoryType::kRocm), nullptr);
  EXPECT_EQ(reg.ForType(MemoryType::kRocm)->name(), "fake_usable");
  EXPECT_EQ(reg.ForType(MemoryType::kCxl), nullptr);

  // Same name: replaced in place, not added twice.
  const size_t before = reg.All().size();
  reg.Register(std::make_shared<FakeDevicePlatform>("fake_usable", false, device_range, sizeof(device_range)));
  EXPECT_EQ(reg.All().size(), before);
  EXPECT_EQ(reg.Classify(device_range + 10).ToString(), "host");
  EXPECT_EQ(reg.ForType(MemoryType::kRocm), nullptr);

  reg.Register(nullptr);
  EXPECT_EQ(reg.All().size(), before);
  EXPECT_TRUE(reg.Unregister("fake_usable"));
  EXPECT_TRUE(reg.Unregister("fake_unusable"));
  EXPECT_FALSE(reg.Unregister("fake_usable"));
  EXPECT_EQ(reg.All().size(), before - 2);
}

TEST(PlatformTest, CopyAsyncWithoutAStreamAsksForThePlatformsOwn) {
  char a[4] = {};
  FakeDevicePlatform fake("fake_streams", true, a, sizeof(a));
  Platform& p = fake;
  EXPECT_EQ(p.CopyAsync(a, a, 4, 0).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(fake.last_stream, nullptr);
  int stream = 0;
  EXPECT_EQ(p.CopyAsync(a, a, 4, 0, &stream).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(fake.last_stream, &stream);
}

TEST(PlatformTest, DmabufAndLocalityDefaultToNotImplemented) {
  char a[4] = {};
  FakeDevicePlatform fake("fake_defaults", true, a, sizeof(a));
  Platform& p = fake;
  StatusOr<DmabufExport> d = p.ExportDmabuf(a, 4);
  EXPECT_EQ(d.status().code(), ErrorCode::kNotImplemented);
  EXPECT_NE(d.status().message().find("fake_defaults"), std::string::npos) << d.status().message();
  EXPECT_EQ(p.Locality(0).status().code(), ErrorCode::kNotImplemented);
  std::shared_ptr<Platform> cpu = PlatformRegistry::Get().Find("cpu");
  EXPECT_EQ(cpu->ExportDmabuf(a, 4).status().code(), ErrorCode::kNotImplemented);
}

TEST(PlatformRegistryTest, OwnerOfAndLocalityAskTheServingPlatform) {
  auto& reg = PlatformRegistry::Get();
  static char owned[64];
  static char unusable[64];
  auto usable = std::make_shared<FakeDevicePlatform>("fake_owner", true, owned, sizeof(owned));
  reg.Register(usable);
  reg.Register(std::make_shared<FakeDevicePlatform>("fake_owner_off", false, unusable, sizeof(unusable)));
  EXPECT_EQ(reg.OwnerOf(owned + 3, MemoryType::kRocm), usable);
  EXPECT_EQ(reg.OwnerOf(owned + 3, MemoryType::kCuda), nullptr);  // another type
  EXPECT_EQ(reg.OwnerOf(unusable, MemoryType::kRocm), nullptr);   // its platform is not usable
  EXPECT_EQ(reg.OwnerOf(nullptr, MemoryType::kRocm), nullptr);
  EXPECT_EQ(reg.OwnerOf(owned, MemoryType::kHost), nullptr);
  // The fake has no locality: the registry passes the platform's answer on.
  EXPECT_EQ(reg.Locality(MemoryKind{MemoryType::kRocm, 2}).status().code(), ErrorCode::kNotImplemented);
  EXPECT_EQ(reg.Locality(MemoryKind{MemoryType::kHost, -1}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(reg.Locality(MemoryKind{MemoryType::kMusa, 0}).status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_TRUE(reg.Unregister("fake_owner"));
  EXPECT_TRUE(reg.Unregister("fake_owner_off"));
}

}  // namespace
}  // namespace mooncake::te
