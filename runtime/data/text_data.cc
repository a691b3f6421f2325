#include "runtime/data/text_data.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

namespace strata::runtime {
namespace {

// SplitMix64's finalizer: a counter-based hash, so batch i needs no state from batches < i.
uint64_t Hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Status AppendFile(const std::filesystem::path& path, std::string* text) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoErrorFromErrno(errno, "reading " + path.string());
  text->append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return Status::Ok();
}

}  // namespace

Result<std::string> LoadText(const std::string& path) {
  std::string text;
  std::error_code ec;
  if (!path.empty()) {
    if (!std::filesystem::is_regular_file(path, ec)) {
      return NotFoundError("--data " + path + ": no such file");
    }
    STRATA_RETURN_IF_ERROR(AppendFile(path, &text));
    return text;
  }
  if (!std::filesystem::is_directory(kFortunesDir, ec)) {
    return NotFoundError(std::string("no --data file and the default text (") + kFortunesDir +
                         ", Debian package `fortunes`) is missing: run scripts/setup.sh or "
                         "apt-get install fortunes, or pass --data FILE");
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(kFortunesDir, ec)) {
    if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) STRATA_RETURN_IF_ERROR(AppendFile(p, &text));
  return text;
}

void FillBatch(std::string_view text, int rows, int seq, uint64_t seed, uint64_t first_sample,
               int64_t* inputs, int64_t* targets) {
  const uint64_t span = text.size() - seq;
  for (int b = 0; b < rows; ++b) {
    const uint64_t off = Hash(seed ^ Hash(first_sample + static_cast<uint64_t>(b))) % span;
    for (int t = 0; t < seq; ++t) {
      inputs[b * seq + t] = static_cast<unsigned char>(text[off + t]);
      targets[b * seq + t] = static_cast<unsigned char>(text[off + t + 1]);
    }
  }
}

}  // namespace strata::runtime
