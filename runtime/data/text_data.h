// The training text of `strata train` and how its micro-batches are drawn.
//
// The text is one byte stream (the model's vocabulary is the 256 byte values). Micro-batch i of a
// run takes its rows at offsets drawn from a counter-based hash of (seed, i, row), so the data
// position is just the number of micro-batches consumed, and a run resumed at micro-batch i sees
// exactly the batches the straight run would have.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace strata::runtime {

// Debian's `fortunes` package: the default text.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The bytes of the file `path`; with an empty path, the extension-less files of kFortunesDir
// concatenated in name order. NotFound (saying how to get the text) if either is missing.
Result<std::string> LoadText(const std::string& path);

// Training samples first_sample .. first_sample + rows - 1: `rows` rows of `seq` bytes into
// `inputs` (row-major) and the byte that follows each into `targets`. Sample k's bytes depend on
// (seed, k) only, so a global batch is the same however ranks and micro-batches split it.
// REQUIRES: text.size() >= seq + 2; each buffer holds rows * seq.
void FillBatch(std::string_view text, int rows, int seq, uint64_t seed, uint64_t first_sample,
               int64_t* inputs, int64_t* targets);

}  // namespace strata::runtime
