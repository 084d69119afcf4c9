// NvlinkDomainFromNvml against the FAKE NVML of testing/fake_nvml.cc (FAKE_NVML_LIBRARY from the BUILD env): the
// domain text, and every reason there is none.
#include "transfer_engine/transport/nvlink/nvml_domain.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace mooncake::te::nvlink {
namespace {

std::vector<std::string> Fake() { return {getenv("FAKE_NVML_LIBRARY")}; }

// Why device 0 of the fake has no domain.
std::string Why() { return NvlinkDomainFromNvml(Fake(), "0000:3b:00.0").status().message(); }

// Sets a fake-NVML knob for one test; restores it after.
class Knob {
 public:
  Knob(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~Knob() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(NvmlDomainTest, IsTheClusterUuidAndClique) {
  auto d = NvlinkDomainFromNvml(Fake(), "0000:3c:00.0");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, "00112233-4455-6677-8899-aabbccddeeff:7");
  Knob uuid("FAKE_NVML_CLUSTER_UUID", "F00DF00DF00DF00DF00DF00DF00DF00D"), clique("FAKE_NVML_CLIQUE", "32766");
  EXPECT_EQ(*NvlinkDomainFromNvml(Fake(), "0000:3b:00.0"), "f00df00d-f00d-f00d-f00d-f00df00df00d:32766");
}

TEST(NvmlDomainTest, SaysWhyThereIsNone) {
  auto none = NvlinkDomainFromNvml({"libno-such-nvml.so.1"}, "0000:3b:00.0");
  EXPECT_EQ(none.status().code(), ErrorCode::kDeviceNotFound);
  EXPECT_NE(none.status().message().find("no NVML: libnvidia-ml.so.*: not found (libno-such-nvml.so.1: "), std::string::npos)
      << none.status().message();
  auto unknown = NvlinkDomainFromNvml(Fake(), "0000:99:00.0");
  EXPECT_EQ(unknown.status().code(), ErrorCode::kContext);
  EXPECT_NE(unknown.status().message().find("nvmlDeviceGetHandleByPciBusId_v2(0000:99:00.0) failed: NVML error 6 "
                                            "(Not Found)"),
            std::string::npos)
      << unknown.status().message();
  {
    Knob k("FAKE_NVML_INIT_RESULT", "9");
    EXPECT_NE(Why().find("nvmlInit_v2 failed: NVML error 9"), std::string::npos);
  }
  {
    Knob k("FAKE_NVML_FABRIC_STATE", "0");  // a GPU without an NVSwitch fabric (an H200 box)
    auto s = NvlinkDomainFromNvml(Fake(), "0000:3b:00.0").status();
    EXPECT_EQ(s.code(), ErrorCode::kNotImplemented);
    EXPECT_NE(s.message().find("GPU 0000:3b:00.0 is in no NVLink fabric"), std::string::npos) << s.message();
  }
  {
    Knob k("FAKE_NVML_FABRIC_STATE", "2");
    EXPECT_NE(Why().find("not complete (NVML fabric state 2)"), std::string::npos);
  }
  {
    Knob k("FAKE_NVML_FABRIC_STATUS", "999");
    EXPECT_NE(Why().find("registration failed: NVML error 999"), std::string::npos);
  }
  {
    Knob k("FAKE_NVML_CLUSTER_UUID", "00000000000000000000000000000000");
    EXPECT_NE(Why().find("no fabric cluster UUID"), std::string::npos);
  }
  EXPECT_EQ(NvlinkDomainFromNvml({}, "0000:3b:00.0").status().code(), ErrorCode::kDeviceNotFound);
}

}  // namespace
}  // namespace mooncake::te::nvlink
