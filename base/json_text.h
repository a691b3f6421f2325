// The one way strata turns untrusted text into nlohmann::json: configs, checkpoint manifests and
// entries, safetensors headers, Hugging Face config and index files, .jsonl records, swap
// manifests. Every JSON input is read through ParseJsonText or ReadJsonFile, never through
// nlohmann::json::parse directly, so that the same limits hold everywhere:
//
//  - size: text longer than `max_bytes` is refused before it is parsed (a file, before it is read);
//  - nesting: more than `max_depth` levels of arrays/objects are refused before anything is built.
//    nlohmann's parser and destructor are iterative, but dump(), copies and operator== recurse,
//    and so do strata's own walks: 100000 '[' used to overflow the stack in an error message;
//  - duplicate keys in any object are refused (JSON leaves them undefined, nlohmann keeps the
//    last one: `"stage": 3, "stage": 0` would silently train at stage 0; DeepSpeed refuses them);
//  - syntax, invalid UTF-8 and numbers that overflow a double are refused with the byte offset.
//
// Every refusal has the caller's code (InvalidArgument for what a user wrote, DataLoss for what
// strata or a model's publisher stored) and a message starting with the source (a file name).
// Stateless; any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace strata {

struct JsonReadOptions {
  // The largest text accepted (for a file: its size, checked before reading).
  uint64_t max_bytes = 64ull << 20;
  // The deepest nesting accepted: `[]` and `{}` are depth 1, `[[]]` depth 2.
  int max_depth = 64;
  // `//` and `/* */` comments, as DeepSpeed's hjson reader of configs accepts.
  bool allow_comments = false;
  // The code of every refusal of the contents (a missing file stays kNotFound, a failed read
  // kIoError).
  StatusCode code = StatusCode::kInvalidArgument;
};

// Parses `text`, read from `source` (named first in every message), within `options`.
Result<nlohmann::json> ParseJsonText(std::string_view text, std::string_view source,
                                     const JsonReadOptions& options = {});

// Reads the regular file `path` (refusing anything else, and a file over options.max_bytes,
// before reading: see ReadSmallFile) and parses it with ParseJsonText.
Result<nlohmann::json> ReadJsonFile(const std::string& path, const JsonReadOptions& options = {});

}  // namespace strata
