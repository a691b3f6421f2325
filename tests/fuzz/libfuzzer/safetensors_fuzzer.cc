// libFuzzer entry point: the safetensors reader and HfCheckpoint over a single file
// (tests/fuzz/fuzz_targets.h). The first input byte picks the file and whether its framing is kept
// valid; the rest replaces it.
#include "tests/fuzz/libfuzzer/fuzzer_main.h"

namespace {
strata::fuzz::FileTarget& Target() {
  return strata::fuzz::TargetOnce(strata::fuzz::MakeSafetensorsTarget);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::fuzz::WriteSeedCorpus(strata::fuzz::EncodedSeeds(Target()));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::ExpectClean(Target().RunEncoded({reinterpret_cast<const char*>(data), size}),
                            Target().dir());
  return 0;
}
