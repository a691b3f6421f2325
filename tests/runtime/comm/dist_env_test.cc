// DistEnvFromVariables: the torchrun contract parsed strictly (runtime/comm/gloo_communicator.h).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "runtime/comm/gloo_communicator.h"
#include "strata/config.h"

namespace strata::runtime {
namespace {

// Values are assigned as std::string, not from literals: GCC 12 at -O2 warns (-Wrestrict, a false
// positive in basic_string::_M_replace, GCC bug 105329) on map[key] = "literal".
using Vars = std::map<std::string, std::string>;

Result<std::optional<DistEnv>> Parse(const Vars& vars) {
  return DistEnvFromVariables([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

Vars Full() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

TEST(DistEnvTest, NothingSetIsOneRank) {
  auto r = Parse({});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->has_value());
  // A cluster profile's MASTER_ADDR/MASTER_PORT, or a wrapper's LOCAL_RANK, without RANK and
  // WORLD_SIZE: still one rank.
  r = Parse({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"LOCAL_RANK", "0"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->has_value());
}

TEST(DistEnvTest, FullContract) {
  Vars v = Full();
  v["LOCAL_WORLD_SIZE"] = std::string("2");
  auto r = Parse(v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  const DistEnv& e = **r;
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(DistEnvTest, LocalWorldSizeDefaultsToWorldSize) {
  auto r = Parse(Full());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->local_world_size, 4);
}

void ExpectInvalid(const Vars& v, const std::string& needle) {
  auto r = Parse(v);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string_view::npos) << r.status().ToString();
}

TEST(DistEnvTest, PartiallySetNamesWhatIsMissing) {
  ExpectInvalid({{"RANK", "0"}},
                "RANK=0 set but not WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT");
  Vars v = Full();
  v.erase("MASTER_PORT");
  ExpectInvalid(v, "but not MASTER_PORT");
  ExpectInvalid({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
                "but not RANK, LOCAL_RANK, MASTER_PORT");
}

TEST(DistEnvTest, BadValuesAreNamed) {
  Vars v = Full();
  v["RANK"] = std::string("x1");
  ExpectInvalid(v, "RANK='x1' is not an integer");
  v = Full();
  v["WORLD_SIZE"] = std::string("4 ");
  ExpectInvalid(v, "WORLD_SIZE='4 '");
  v = Full();
  v["RANK"] = std::string("4");
  ExpectInvalid(v, "RANK=4 is outside 0..WORLD_SIZE-1 (WORLD_SIZE=4)");
  v = Full();
  v["RANK"] = std::string("-1");
  ExpectInvalid(v, "RANK=-1");
  v = Full();
  v["MASTER_PORT"] = std::string("70000");
  ExpectInvalid(v, "MASTER_PORT=70000 is outside 1..65535");
  v = Full();
  v["MASTER_PORT"] = std::string("0");
  ExpectInvalid(v, "MASTER_PORT=0");
  v = Full();
  v["WORLD_SIZE"] = std::string("0");
  ExpectInvalid(v, "WORLD_SIZE=0");
  v = Full();
  v["LOCAL_WORLD_SIZE"] = std::string("1");
  ExpectInvalid(v, "LOCAL_RANK=1 is outside 0..LOCAL_WORLD_SIZE-1");
  v = Full();
  v["MASTER_ADDR"] = std::string("");
  ExpectInvalid(v, "MASTER_ADDR is empty");
}

#if !STRATA_HAVE_TORCH  // (a libtorch build without Gloo headers is the same)
// Builds without libtorch have the single-rank communicator only; a multi-rank launch says why.
TEST(ConnectGlooTest, WithoutLibtorchMoreThanOneRankIsUnavailable) {
  DistEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = 29500;
  auto r = ConnectGloo(env, 1, std::chrono::seconds(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("needs strata built with libtorch"), std::string_view::npos)
      << r.status().ToString();
}
#endif

}  // namespace
}  // namespace strata::runtime
