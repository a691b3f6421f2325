// TensorBoard event files, written without TensorFlow or libprotobuf: what `strata train
// --tensorboard DIR` leaves for `tensorboard --logdir DIR` (and for any reader of the format:
// tbparse, tensorboard's EventAccumulator, TensorFlow's summary_iterator).
//
// An event file is a TFRecord stream: each record is
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked
//   CRC32C of data
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. Each record's data is a serialized
// `tensorboard.Event` protobuf (tensorboard/compat/proto/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; each scalar is then one Event holding one
// Value, as torch.utils.tensorboard's add_scalar writes it.
//
// EventFileWriter creates DIR/events.out.tfevents.<unix seconds>.<hostname> (the name
// torch.utils.tensorboard and tensorboardX use; TensorBoard reads every file of DIR whose name
// holds "tfevents", in name order), never overwriting one: a run resumed in the same second gets
// ".<pid>" and then ".<n>" appended. Each WriteScalars call is one write(2) of whole records, so a
// process that crashes keeps every step written before it (the kernel has them; nothing waits in
// a user-space buffer). Errors (a directory that cannot be created, ENOSPC, EIO) name the file and
// the errno; after a failed write the file may end in a partial record, which readers of the
// format treat as the end of the stream.
//
// Threads: an EventFileWriter is used by one thread at a time. The free functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/file_util.h"
#include "base/status.h"

namespace strata::metrics {

// CRC-32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected, initial and final XOR
// 0xFFFFFFFF), as RFC 3720 B.4 defines it.
uint32_t Crc32c(std::string_view data);
// The TFRecord mask of a CRC (see the file comment), so that a CRC of data holding CRCs is not
// trivially related to them.
uint32_t MaskCrc(uint32_t crc);

// One TFRecord: the framing around `data`.
std::string EncodeRecord(std::string_view data);
// A serialized Event holding only file_version (the first record of a file).
std::string EncodeFileVersionEvent(double wall_time, std::string_view file_version);
// A serialized Event holding one scalar (Summary.Value with tag and simple_value).
std::string EncodeScalarEvent(double wall_time, int64_t step, std::string_view tag, float value);

struct Scalar {
  std::string tag;  // e.g. "train/loss"
  float value = 0;  // written as is (NaN and infinities included: TensorBoard shows them)
};

class EventFileWriter {
 public:
  // Creates `dir` (and missing parents) and a new event file in it, holding the file_version
  // record. kIoError (or kFailedPrecondition for a `dir` that is not a directory) naming the path.
  static Result<EventFileWriter> Create(const std::string& dir);

  EventFileWriter(EventFileWriter&&) noexcept = default;
  EventFileWriter& operator=(EventFileWriter&&) noexcept = default;

  // Appends one Event per scalar, all at `step` and the current wall time, in one write.
  Status WriteScalars(int64_t step, const std::vector<Scalar>& scalars);

  // Closes the file, reporting close(2)'s error (write-back errors on some filesystems).
  Status Close();

  const std::string& path() const { return path_; }

 private:
  EventFileWriter(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

  UniqueFd fd_;
  std::string path_;
};

}  // namespace strata::metrics
