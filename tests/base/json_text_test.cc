// base/json_text: the limits every JSON input of strata is read under. Each refusal is checked for
// its code and for a message naming the source and the place (byte offset or key path); valid
// documents must come out exactly as nlohmann's own parser reads them.
#include "base/json_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(JsonTextTest, ValidDocumentsParseAsNlohmannParsesThem) {
  const char* texts[] = {
      "{}",
      "[]",
      "null",
      "\"x\"",
      "-1",
      "18446744073709551615",
      "1e308",
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
          "list": [1, 2.5, "a", [true, false, null], {"k": {}}], "u": "\u00e9\ud83d\ude00"})",
  };
  for (const char* text : texts) {
    Result<nlohmann::json> j = ParseJsonText(text, "t.json");
    ASSERT_TRUE(j.ok()) << text << ": " << j.status().ToString();
    EXPECT_EQ(*j, nlohmann::json::parse(text)) << text;
    EXPECT_EQ(j->dump(), nlohmann::json::parse(text).dump()) << text;  // same types, too
  }
}

TEST(JsonTextTest, DepthAtTheLimitIsAcceptedOneMoreIsRefusedWithItsOffset) {
  const std::string ok = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(ParseJsonText(ok, "t.json").ok());
  const std::string deep = "{\"a\": " + std::string(65, '[') + std::string(65, ']') + "}";
  Result<nlohmann::json> j = ParseJsonText(deep, "t.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  // '{' is level 1, so the 64th '[' (offset 6 + 63) opens level 65.
  EXPECT_EQ(Message(j.status()), "t.json: nested deeper than 64 levels (at byte 69)");
}

TEST(JsonTextTest, HundredThousandOpenBracketsAreAnErrorNotAStackOverflow) {
  for (const std::string& open : {std::string(100000, '['), std::string(100000, '{')}) {
    Result<nlohmann::json> j = ParseJsonText(open, "deep.json");
    ASSERT_FALSE(j.ok());
    EXPECT_THAT(Message(j.status()), StartsWith("deep.json: nested deeper than 64 levels"));
  }
  // Balanced, so nlohmann alone would build it (and then crash in dump(), a copy or ==).
  std::string balanced;
  for (int i = 0; i < 100000; ++i) balanced += "{\"k\":[";
  balanced += std::string(100000, ']');
  Result<nlohmann::json> j = ParseJsonText(balanced, "deep.json");
  EXPECT_THAT(Message(j.status()), HasSubstr("nested deeper than 64 levels"));
}

TEST(JsonTextTest, BracketsInStringsAndCommentsDoNotCount) {
  const std::string in_string = "[\"" + std::string(1000, '[') + "\\\"" + "\"]";
  EXPECT_TRUE(ParseJsonText(in_string, "t.json").ok());
  JsonReadOptions comments;
  comments.allow_comments = true;
  const std::string in_comments =
      "// " + std::string(100, '[') + "\n{/* " + std::string(100, '{') + " */ \"a\": 1}";
  Result<nlohmann::json> j = ParseJsonText(in_comments, "t.json", comments);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["a"], 1);
  // A '\r' ends a line comment for nlohmann, so what follows it is counted.
  const std::string after_cr = "// x\r" + std::string(65, '[') + std::string(65, ']');
  EXPECT_THAT(Message(ParseJsonText(after_cr, "t.json", comments).status()),
              HasSubstr("nested deeper than 64 levels"));
  // Comments are refused unless allowed.
  EXPECT_FALSE(ParseJsonText(in_comments, "t.json").ok());
}

TEST(JsonTextTest, CustomDepthLimit) {
  JsonReadOptions o;
  o.max_depth = 2;
  EXPECT_TRUE(ParseJsonText("[[1]]", "t", o).ok());
  EXPECT_EQ(Message(ParseJsonText("[[[1]]]", "t", o).status()),
            "t: nested deeper than 2 levels (at byte 2)");
}

TEST(JsonTextTest, SizeLimitIsCheckedFirst) {
  JsonReadOptions o;
  o.max_bytes = 10;
  o.code = StatusCode::kDataLoss;
  EXPECT_TRUE(ParseJsonText("[1,2,3,4]", "t", o).ok());  // 9 bytes
  Result<nlohmann::json> j = ParseJsonText("[1,2,3,4,5]", "t", o);
  EXPECT_EQ(j.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(Message(j.status()), "t: 11 bytes, more than the limit of 10");
}

TEST(JsonTextTest, DuplicateKeysAreRefusedWhereverTheyAre) {
  EXPECT_EQ(Message(ParseJsonText(R"({"a": 1, "a": 1})", "c.json").status()),
            "c.json: duplicate key \"a\" in the top-level object");
  EXPECT_EQ(
      Message(
          ParseJsonText(R"({"zero_optimization": {"stage": 3, "stage": 0}})", "c.json").status()),
      "c.json: duplicate key \"stage\" in zero_optimization");
  EXPECT_EQ(
      Message(ParseJsonText(R"({"a": {"b": [0, {"c": {"x": 1, "x": 2}}]}})", "c.json").status()),
      "c.json: duplicate key \"x\" in a.b[1].c");
  EXPECT_EQ(Message(ParseJsonText(R"([{}, [], {"k": [], "k": {}}])", "c.json").status()),
            "c.json: duplicate key \"k\" in [2]");
  // The same key in different objects is fine.
  EXPECT_TRUE(
      ParseJsonText(R"({"a": {"k": 1}, "b": {"k": 1}, "k": [{"k": 1}, {"k": 2}]})", "c").ok());
}

TEST(JsonTextTest, SyntaxErrorsNameTheByteOffsetAndEscapeOddBytes) {
  Result<nlohmann::json> j = ParseJsonText("{\"a\": [1, 2, \xff]}", "t.json");
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(j.status()),
              StartsWith("t.json: not valid JSON at byte offset 13 (line 1, column 14): "));
  EXPECT_THAT(Message(j.status()), HasSubstr("\\xFF"));
  EXPECT_THAT(Message(ParseJsonText("{\"a\": \"x\xc3\x28\"}", "t.json").status()),
              HasSubstr("ill-formed UTF-8"));
  EXPECT_THAT(Message(ParseJsonText("{\"a\":1,\n \"b\": }", "t.json").status()),
              StartsWith("t.json: not valid JSON at byte offset 14 (line 2, column 7)"));
  EXPECT_THAT(Message(ParseJsonText("[1e309]", "t.json").status()),
              HasSubstr("number overflow parsing '1e309'"));
  // nlohmann alone reads a NUL as the end of the input and accepts what comes before it.
  EXPECT_EQ(Message(ParseJsonText(std::string("{}\0 junk", 8), "t.json").status()),
            "t.json: not valid JSON at byte offset 2: a NUL byte");
  EXPECT_THAT(Message(ParseJsonText("[\"\x01\"]", "t.json").status()),
              HasSubstr("control character U+0001 (SOH) must be escaped"));
  EXPECT_THAT(Message(ParseJsonText("", "t.json").status()), StartsWith("t.json: not valid JSON"));
  EXPECT_THAT(Message(ParseJsonText("{} {}", "t.json").status()),
              StartsWith("t.json: not valid JSON"));
}

class ReadJsonFileTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_.File(name), std::ios::binary) << text;
    return dir_.File(name);
  }
  testing::TempDir dir_{"strata-json-text-test"};
};

TEST_F(ReadJsonFileTest, ReadsARegularFile) {
  Result<nlohmann::json> j = ReadJsonFile(Write("a.json", R"({"stage": 3})"));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["stage"], 3);
}

TEST_F(ReadJsonFileTest, RefusesWhatIsNotARegularFileByName) {
  Result<nlohmann::json> zero = ReadJsonFile("/dev/zero");
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(zero.status()), "/dev/zero: not a regular file (a character device)");
  EXPECT_EQ(Message(ReadJsonFile(dir_.path()).status()),
            dir_.path() + ": not a regular file (a directory)");
  // Opening a FIFO with no writer must not block.
  const std::string fifo = dir_.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(Message(ReadJsonFile(fifo).status()), fifo + ": not a regular file (a FIFO)");
  EXPECT_EQ(ReadJsonFile(dir_.File("missing.json")).status().code(), StatusCode::kNotFound);
}

TEST_F(ReadJsonFileTest, RefusesAFileOverTheLimitWithTheCallersCode) {
  JsonReadOptions o;
  o.max_bytes = 4;
  o.code = StatusCode::kDataLoss;
  const std::string path = Write("big.json", "[1, 2]");
  Result<nlohmann::json> j = ReadJsonFile(path, o);
  EXPECT_EQ(j.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(Message(j.status()), path + ": 6 bytes, more than the limit of 4");
  // Parse errors carry the path as their source, with the caller's code.
  Result<nlohmann::json> bad =
      ReadJsonFile(Write("bad.json", "[1,"), {.code = StatusCode::kDataLoss});
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(Message(bad.status()), StartsWith(dir_.File("bad.json") + ": not valid JSON"));
}

}  // namespace
}  // namespace strata
