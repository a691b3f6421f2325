// libFuzzer entry point: strata's DeepSpeed config parser (ParseConfig, through ParseJsonText).
// Seeds: the configs in examples/ and tests/data/deepspeed_configs (scripts/fuzz.sh).
#include "tests/fuzz/libfuzzer/fuzzer_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::ExpectClean(strata::fuzz::RunConfig({reinterpret_cast<const char*>(data), size}),
                            strata::fuzz::kConfigSource);
  return 0;
}
