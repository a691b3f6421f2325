// The device registry (tiers/device_registry.h): which kinds a program linking strata_devices has,
// spec parsing, the errors a user sees, "auto", and factories registered by the program itself.
// Tests that register kinds use names no other test uses, so they hold in any order and when the
// whole binary runs in one process.
#include "tiers/device_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "strata/config.h"
#include "tiers/host_device.h"

namespace strata {
namespace {

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(DeviceRegistryTest, EveryKindOfThisBuildIsRegisteredInOrder) {
  const std::vector<std::string> kinds = RegisteredDeviceKinds();
  EXPECT_TRUE(Has(kinds, "host"));
  // Fails if the linker dropped gpu/'s self-registering object (Note [Device registration]).
  EXPECT_EQ(Has(kinds, "cuda"), STRATA_HAVE_CUDA == 1);
  EXPECT_TRUE(std::is_sorted(kinds.begin(), kinds.end()));
}

TEST(DeviceRegistryTest, UnknownKindListsTheRegisteredKinds) {
  Result<std::unique_ptr<DeviceBackend>> d = OpenDevice("tpu:0");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  const std::string text(d.status().message());
  EXPECT_EQ(text.rfind("device tpu:0: unknown device kind 'tpu'", 0), 0u) << text;
  for (const std::string& kind : RegisteredDeviceKinds()) {
    EXPECT_NE(text.find(kind), std::string::npos) << kind << " missing from: " << text;
  }
}

TEST(DeviceRegistryTest, CudaSaysWhyItCannotOpen) {
  Result<std::unique_ptr<DeviceBackend>> d = OpenDevice("cuda:0");
  if (!STRATA_HAVE_CUDA) {
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(d.status().message(),
              "device cuda:0: strata was not built with CUDA support (configure with "
              "STRATA_WITH_CUDA=ON)");
    return;
  }
  if (d.ok()) GTEST_SKIP() << "a GPU is present: " << (*d)->info().name;
  // Built with CUDA, no usable GPU: CudaDevice's own error comes through, with the spec first.
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable) << d.status().ToString();
  const std::string text(d.status().message());
  EXPECT_EQ(text.rfind("device cuda:0: ", 0), 0u) << text;
  EXPECT_NE(text.find("cuda error"), std::string::npos) << text;
}

TEST(DeviceRegistryTest, AutoIsCudaWhenItOpensElseHost) {
  const bool gpu = OpenDevice("cuda:0").ok();
  for (const char* spec : {"auto", ""}) {
    Result<std::unique_ptr<DeviceBackend>> d = OpenDevice(spec, {.budget_bytes = 1 << 20});
    ASSERT_TRUE(d.ok()) << spec << ": " << d.status().ToString();
    EXPECT_EQ(dynamic_cast<HostDevice*>(d->get()) == nullptr, gpu) << spec;
    EXPECT_EQ((*d)->info().budget_bytes, 1u << 20);
  }
}

TEST(DeviceRegistryTest, HostTakesTheBudgetAndAnyIndex) {
  Result<std::unique_ptr<DeviceBackend>> d = OpenDevice("host:3", {.budget_bytes = 3 << 20});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->info().budget_bytes, 3u << 20);
  Result<std::unique_ptr<DeviceBackend>> def = OpenDevice("host");
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ((*def)->info().budget_bytes, HostDeviceOptions{}.budget_bytes);
}

TEST(DeviceRegistryTest, MalformedSpecsAreInvalidArguments) {
  for (const char* spec :
       {"host:", "host:x", "host:-1", "host:1x", "host:99999999999", "auto:0", ":0", "HOST"}) {
    Result<std::unique_ptr<DeviceBackend>> d = OpenDevice(spec);
    ASSERT_FALSE(d.ok()) << spec;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_EQ(d.status().message().rfind("device " + std::string(spec) + ": ", 0), 0u)
        << d.status().ToString();
  }
}

TEST(DeviceRegistryTest, FactoryGetsTheIndexAndOptions) {
  DeviceOptions seen;
  ASSERT_TRUE(
      RegisterDevice("fake_options",
                     [&seen](const DeviceOptions& o) -> Result<std::unique_ptr<DeviceBackend>> {
                       seen = o;
                       return std::unique_ptr<DeviceBackend>(std::make_unique<HostDevice>());
                     })
          .ok());
  EXPECT_TRUE(Has(RegisteredDeviceKinds(), "fake_options"));
  Result<std::unique_ptr<DeviceBackend>> d =
      OpenDevice("fake_options:7", {.index = 2, .budget_bytes = 5 << 20, .copy_delay_us = 9});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(seen.index, 7);  // the spec's index wins
  EXPECT_EQ(seen.budget_bytes, 5u << 20);
  EXPECT_EQ(seen.copy_delay_us, 9u);
  ASSERT_TRUE(OpenDevice("fake_options").ok());
  EXPECT_EQ(seen.index, 0);
}

TEST(DeviceRegistryTest, FactoryErrorsKeepTheirCodeAndGainTheSpec) {
  ASSERT_TRUE(RegisterDevice("fake_failing",
                             [](const DeviceOptions&) -> Result<std::unique_ptr<DeviceBackend>> {
                               return ResourceExhaustedError("no room");
                             })
                  .ok());
  Result<std::unique_ptr<DeviceBackend>> d = OpenDevice("fake_failing:1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status().message(), "device fake_failing:1: no room");
}

TEST(DeviceRegistryTest, RegistrationRefusesTakenAndBadKinds) {
  auto factory = [](const DeviceOptions&) -> Result<std::unique_ptr<DeviceBackend>> {
    return std::unique_ptr<DeviceBackend>(std::make_unique<HostDevice>());
  };
  EXPECT_EQ(RegisterDevice("host", factory).code(), StatusCode::kAlreadyExists);
  for (const char* bad : {"", "auto", "Cuda", "a:b", "has space"}) {
    EXPECT_EQ(RegisterDevice(bad, factory).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(RegisterDevice("fake_empty", nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Has(RegisteredDeviceKinds(), "fake_empty"));
}

}  // namespace
}  // namespace strata
