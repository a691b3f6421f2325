// Validators for `strata` flags, one per class of value, so that every flag of every command is
// checked the same way before its command runs (CLI11 refuses the value: exit code 2, a message
// naming the flag and the value, nothing started).
//
//   cmd.add_option("--threads", threads_, "...")->check(flags::Threads());
//   cmd.add_option("--config", config_, "...")->check(flags::InputFile());
//   cmd.add_option("--device-memory", budget_, "...")->check(flags::ByteSize(1, kMaxBytes));
//
// Classes:
//   * real numbers: Real(min, max) (finite, within the interval; NaN is refused).
//   * counts: CLI::Range on the option's own integer type (an out-of-type value such as "1e99" or
//     "abc" is refused by CLI11's conversion). Threads() bounds thread counts to what a process can
//     usefully start; Steps() bounds step counts.
//   * byte sizes: ByteSize (base/bytes.h ParseBytes syntax: 512M, 4G, 1e9).
//   * paths read: InputFile (an existing regular file: not a directory, FIFO or device, so
//     `--config /dev/zero` is refused before it is read), InputDirectory.
//   * paths written: OutputFile (not a directory; its parent exists and is a directory),
//     OutputDirectory (not an existing non-directory; its nearest existing ancestor is a
//     directory, so `--save a/b/c` may create a/b/c).
//   * lists and specs: StepRange ("N" or "A-B", 1 <= A <= B), CommaList(element validator).
// A validator returns CLI11's error text (empty = valid); CLI11 prefixes the flag name.
//
// Thread-safety: validators are plain functions of their input, used on the main thread.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace CLI {
class Validator;
}

namespace strata::runtime::flags {

// The most threads a --threads flag accepts: more than any machine strata runs on has cores,
// few enough that starting them cannot exhaust the process (--threads 100000 used to hang).
inline constexpr int64_t kMaxThreads = 1024;
// The most optimizer steps, batches or passes a count flag accepts (2^40: beyond any run, far from
// int64 overflow when multiplied by a batch size).
inline constexpr int64_t kMaxCount = int64_t{1} << 40;

// The largest byte size a size flag accepts (1 PiB).
inline constexpr uint64_t kMaxBytes = uint64_t{1} << 50;
// The longest sequence a --seq-len accepts before the model's own limit is checked (2^20 tokens).
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;

// [min_threads, kMaxThreads]; min_threads 0 where 0 means "all cores".
CLI::Validator Threads(int64_t min_threads = 1);
// [min, kMaxCount].
CLI::Validator Count(int64_t min = 1);
// [1, kMaxSeqLen].
CLI::Validator SeqLen();
// A non-negative integer that fits 64 bits, written in decimal digits ("-1" is refused, not
// wrapped).
CLI::Validator Seed();
// A finite real number in [min, max] ((min, max] with min_open): NaN, inf and text are refused as
// what they are; a value outside as outside the interval, both ends shown as %g writes them
// ("0.5 is outside [1e-09, 1e+06]"). CLI11's own PositiveNumber/Range accept NaN (every
// comparison with it is false) and print their ends rounded (0.000000 for 1e-9).
CLI::Validator Real(double min, double max, bool min_open = false);
// A device spec --device takes: auto, host, host:N, cuda, cuda:N (tiers/device_registry.h).
CLI::Validator DeviceSpec();
// A byte size (ParseBytes) in [min, max].
CLI::Validator ByteSize(uint64_t min, uint64_t max);
// ByteSize's check as a function, for the Python face (strata.initialize(host_memory=...)):
// kInvalidArgument with ParseBytes' message or the range.
Result<uint64_t> ParseByteSizeIn(const std::string& text, uint64_t min, uint64_t max);
// ByteSize, or the word "auto" (--host-memory).
CLI::Validator ByteSizeOrAuto(uint64_t min, uint64_t max);
CLI::Validator InputFile();
CLI::Validator InputDirectory();
// allow_empty: "" is accepted (a flag where empty means "do not write").
CLI::Validator OutputFile(bool allow_empty = false);
CLI::Validator OutputDirectory();
CLI::Validator StepRange();
// A comma-separated list, each element checked by `element`.
CLI::Validator CommaList(const CLI::Validator& element);

// Parses a step range "N" or "A-B" (1-based, 1 <= A <= B) into [*from, *to]; InvalidArgument
// naming `flag` otherwise.
Status ParseStepRange(const std::string& text, const std::string& flag, int64_t* from, int64_t* to);

// The checks behind the validators, for values that do not come from a flag (empty = valid).
std::string CheckInputFile(const std::string& path);
std::string CheckInputDirectory(const std::string& path);
std::string CheckOutputFile(const std::string& path);
std::string CheckOutputDirectory(const std::string& path);

}  // namespace strata::runtime::flags
