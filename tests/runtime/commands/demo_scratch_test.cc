// DemoScratch (runtime/commands/demo_scratch.h) on a directory of the test's own (the real
// /tmp/strata-demo-UID is shared with demo runs of tests beside this one): the directory is
// removed by the last holder only, never while another holds it or while something is in it; an
// outsider's removal (strata clean) takes the lock without waiting and creates nothing; a
// directory others may use, or a link, is refused naming it.
#include "runtime/commands/demo_scratch.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

class DemoScratchTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(tmp_.ok()); }
  std::string Path() const { return tmp_.path() + "/strata-demo"; }
  strata::testing::TempDir tmp_{"strata-demo-scratch-test"};
};

TEST_F(DemoScratchTest, MadePrivateAndRemovedByItsLastHolderOnly) {
  std::optional<DemoScratch> first(std::in_place), second(std::in_place);
  ASSERT_TRUE(first->Open(Path()).ok());
  EXPECT_EQ(first->path(), Path());
  EXPECT_EQ(fs::status(Path()).permissions() & fs::perms::all, fs::perms::owner_all);
  ASSERT_TRUE(second->Open(Path()).ok());
  EXPECT_FALSE(RemoveDemoScratchIfUnused(Path()));  // both hold it
  first.reset();
  EXPECT_TRUE(fs::is_directory(Path())) << "removed while another run held it";
  second.reset();
  EXPECT_FALSE(fs::exists(Path()));
}

TEST_F(DemoScratchTest, NeverRemovedWithSomethingInIt) {
  {
    DemoScratch s;
    ASSERT_TRUE(s.Open(Path()).ok());
    std::ofstream(Path() + "/left-by-a-dead-run") << "x";
  }
  EXPECT_TRUE(fs::exists(Path() + "/left-by-a-dead-run"));
  EXPECT_FALSE(RemoveDemoScratchIfUnused(Path()));
  fs::remove(Path() + "/left-by-a-dead-run");
  EXPECT_TRUE(RemoveDemoScratchIfUnused(Path()));
  EXPECT_FALSE(fs::exists(Path()));
}

TEST_F(DemoScratchTest, RemovingAnAbsentDirectoryCreatesNothing) {
  EXPECT_FALSE(RemoveDemoScratchIfUnused(Path()));
  EXPECT_FALSE(fs::exists(Path()));
  fs::create_directory(Path());
  fs::permissions(Path(), fs::perms::owner_all);
  EXPECT_TRUE(RemoveDemoScratchIfUnused(Path()));
}

TEST_F(DemoScratchTest, ADirectoryOthersMayUseOrALinkIsRefused) {
  fs::create_directory(Path());
  fs::permissions(Path(), fs::perms::owner_all | fs::perms::group_all | fs::perms::others_all);
  DemoScratch open_to_all;
  const Status s = open_to_all.Open(Path());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.ToString().find(Path()), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("mode 777"), std::string::npos) << s.ToString();
  // Readable by others (a resumed demo checkpoint's config made it with mkdir -p): accepted.
  fs::permissions(Path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  DemoScratch readable;
  EXPECT_TRUE(readable.Open(Path()).ok());

  const std::string link = tmp_.path() + "/link";
  fs::create_directory(tmp_.path() + "/target");
  fs::permissions(tmp_.path() + "/target", fs::perms::owner_all);
  fs::create_directory_symlink(tmp_.path() + "/target", link);
  DemoScratch linked;
  const Status l = linked.Open(link);
  EXPECT_FALSE(l.ok());
  EXPECT_NE(l.ToString().find(link), std::string::npos) << l.ToString();
}

}  // namespace
}  // namespace strata::runtime
