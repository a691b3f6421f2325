// A reader of TensorBoard event files for tests, written apart from runtime/metrics/event_file.cc
// so that the writer is checked against the format rather than against itself: TFRecord framing
// with both masked CRC32Cs verified (a bitwise CRC32C here, not the writer's boost one), and the
// Event / Summary / Value protobuf fields decoded by their wire types. Anything unexpected (a bad
// CRC, a truncated record, a wire type a field must not have) is reported as an error string.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::testing {

// CRC-32C one bit at a time (reflected polynomial 0x82F63B78): slow and obviously right.
inline uint32_t BitwiseCrc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = BitwiseCrc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

struct TfValue {
  std::string tag;
  float simple_value = 0;
};

struct TfEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  bool has_summary = false;
  std::vector<TfValue> values;
};

namespace internal {

template <typename T>
T LittleEndian(std::string_view bytes) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return v;
}

struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;     // wire type 0, and the raw bits of fixed64 (1) / fixed32 (5)
  std::string_view bytes;  // wire type 2
};

// Splits a message into its fields; false on malformed input.
inline bool ParseFields(std::string_view msg, std::vector<Field>* fields) {
  size_t pos = 0;
  auto varint = [&](uint64_t* out) {
    *out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= msg.size()) return false;
      const auto b = static_cast<unsigned char>(msg[pos++]);
      *out |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80u) == 0) return true;
    }
    return false;
  };
  while (pos < msg.size()) {
    uint64_t key;
    if (!varint(&key)) return false;
    Field f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    switch (f.wire_type) {
      case 0:
        if (!varint(&f.varint)) return false;
        break;
      case 1:
        if (pos + 8 > msg.size()) return false;
        f.varint = LittleEndian<uint64_t>(msg.substr(pos, 8));
        pos += 8;
        break;
      case 5:
        if (pos + 4 > msg.size()) return false;
        f.varint = LittleEndian<uint32_t>(msg.substr(pos, 4));
        pos += 4;
        break;
      case 2: {
        uint64_t len;
        if (!varint(&len) || len > msg.size() - pos) return false;
        f.bytes = msg.substr(pos, len);
        pos += len;
        break;
      }
      default:
        return false;
    }
    fields->push_back(f);
  }
  return true;
}

inline std::string DecodeEvent(std::string_view data, TfEvent* e) {
  std::vector<Field> fields;
  if (!ParseFields(data, &fields)) return "malformed Event";
  for (const Field& f : fields) {
    if (f.number == 1 && f.wire_type == 1) {
      std::memcpy(&e->wall_time, &f.varint, 8);
    } else if (f.number == 2 && f.wire_type == 0) {
      e->step = static_cast<int64_t>(f.varint);
    } else if (f.number == 3 && f.wire_type == 2) {
      e->file_version = std::string(f.bytes);
    } else if (f.number == 5 && f.wire_type == 2) {
      e->has_summary = true;
      std::vector<Field> summary;
      if (!ParseFields(f.bytes, &summary)) return "malformed Summary";
      for (const Field& s : summary) {
        if (s.number != 1 || s.wire_type != 2) return "unexpected Summary field";
        std::vector<Field> value;
        if (!ParseFields(s.bytes, &value)) return "malformed Value";
        TfValue v;
        for (const Field& x : value) {
          if (x.number == 1 && x.wire_type == 2) {
            v.tag = std::string(x.bytes);
          } else if (x.number == 2 && x.wire_type == 5) {
            const auto bits = static_cast<uint32_t>(x.varint);
            std::memcpy(&v.simple_value, &bits, 4);
          } else {
            return "unexpected Value field " + std::to_string(x.number);
          }
        }
        e->values.push_back(v);
      }
    } else {
      return "unexpected Event field " + std::to_string(f.number) + " (wire type " +
             std::to_string(f.wire_type) + ")";
    }
  }
  return "";
}

}  // namespace internal

// Decodes a whole event file's bytes into `events`; returns "" or what is wrong (and where).
inline std::string ReadTfEvents(std::string_view file, std::vector<TfEvent>* events) {
  size_t pos = 0;
  for (int record = 0; pos < file.size(); ++record) {
    const std::string where =
        "record " + std::to_string(record) + " at byte " + std::to_string(pos);
    if (file.size() - pos < 12) return where + ": truncated header";
    const std::string_view header = file.substr(pos, 8);
    const auto length = internal::LittleEndian<uint64_t>(header);
    if (internal::LittleEndian<uint32_t>(file.substr(pos + 8, 4)) != MaskedCrc32c(header)) {
      return where + ": bad length CRC";
    }
    pos += 12;
    if (file.size() - pos < length + 4) return where + ": truncated data";
    const std::string_view data = file.substr(pos, length);
    if (internal::LittleEndian<uint32_t>(file.substr(pos + length, 4)) != MaskedCrc32c(data)) {
      return where + ": bad data CRC";
    }
    pos += length + 4;
    TfEvent e;
    if (std::string err = internal::DecodeEvent(data, &e); !err.empty()) return where + ": " + err;
    events->push_back(std::move(e));
  }
  return "";
}

}  // namespace strata::testing
