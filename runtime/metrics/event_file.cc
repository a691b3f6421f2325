// The event-file writer (event_file.h): the protobuf fields are encoded by hand (three wire types
// suffice: varint, fixed64/fixed32 and length-delimited), the CRC is boost's table-driven
// crc_optimal instantiated for CRC-32C.
#include "runtime/metrics/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

namespace strata::metrics {
namespace {

// Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

// Field numbers of event.proto and summary.proto.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutKey(std::string* out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (uint64_t{field} << 3) | wire_type);
}

// Little-endian, as protobuf's fixed types and TFRecord's framing are.
template <typename T>
void PutLittleEndian(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutDouble(std::string* out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutKey(out, field, kFixed64);
  PutLittleEndian(out, bits);
}

void PutFloat(std::string* out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutKey(out, field, kFixed32);
  PutLittleEndian(out, bits);
}

void PutBytes(std::string* out, uint32_t field, std::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

double WallTimeNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string EncodeRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutLittleEndian(&out, static_cast<uint64_t>(data.size()));
  PutLittleEndian(&out, MaskCrc(Crc32c(out)));
  out.append(data);
  PutLittleEndian(&out, MaskCrc(Crc32c(data)));
  return out;
}

std::string EncodeFileVersionEvent(double wall_time, std::string_view file_version) {
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutBytes(&event, kEventFileVersion, file_version);
  return event;
}

std::string EncodeScalarEvent(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  PutBytes(&v, kValueTag, tag);
  PutFloat(&v, kValueSimpleValue, value);
  std::string summary;
  PutBytes(&summary, kSummaryValue, v);
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  // int64 fields are varints of the two's complement (a negative step takes ten bytes).
  PutKey(&event, kEventStep, kVarint);
  PutVarint(&event, static_cast<uint64_t>(step));
  PutBytes(&event, kEventSummary, summary);
  return event;
}

Result<EventFileWriter> EventFileWriter::Create(const std::string& dir) {
  STRATA_RETURN_IF_ERROR(MakeDirs(dir));
  const double now = WallTimeNow();
  const std::string base =
      dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + HostName();
  // A file of this name belongs to another run (or to this run's previous life, resumed within
  // the same second): never append to it.
  std::string path = base;
  for (int attempt = 0;; ++attempt) {
    Result<UniqueFd> fd = OpenFile(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND, 0644);
    if (fd.ok()) {
      EventFileWriter writer(std::move(*fd), path);
      const std::string first = EncodeRecord(EncodeFileVersionEvent(now, "brain.Event:2"));
      STRATA_RETURN_IF_ERROR(WriteFully(writer.fd_.get(), first.data(), first.size(), path));
      return writer;
    }
    if (fd.status().sys_errno() != EEXIST || attempt >= 100) return fd.status();
    path = base + "." + std::to_string(::getpid()) +
           (attempt == 0 ? "" : "." + std::to_string(attempt));
  }
}

Status EventFileWriter::WriteScalars(int64_t step, const std::vector<Scalar>& scalars) {
  const double now = WallTimeNow();
  std::string records;
  for (const Scalar& s : scalars)
    records += EncodeRecord(EncodeScalarEvent(now, step, s.tag, s.value));
  return WriteFully(fd_.get(), records.data(), records.size(), path_);
}

Status EventFileWriter::Close() { return fd_.Close(path_); }

}  // namespace strata::metrics
