// A token file for the data tests: ids 0, 1, ..., n - 1 as a uint16 .bin, opened as TokenData.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/data/token_data.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {

// Writes `dir`/iota.bin and opens it (vocabulary 65536); null, with a test failure, if it cannot.
inline std::unique_ptr<TokenData> Iota(const strata::testing::TempDir& dir, uint16_t n) {
  std::vector<uint16_t> ids(n);
  std::iota(ids.begin(), ids.end(), uint16_t{0});
  const std::string path = dir.File("iota.bin");
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t));
  TokenDataOptions o;
  o.path = path;
  o.vocab_size = 65536;
  Result<std::unique_ptr<TokenData>> data = TokenData::Open(o);
  EXPECT_TRUE(data.ok()) << data.status().ToString();
  return data.ok() ? std::move(data).value() : nullptr;
}

}  // namespace strata::runtime
