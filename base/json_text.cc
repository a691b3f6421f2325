// ParseJsonText: a bracket pre-scan that enforces the depth limit with a byte offset before
// nlohmann sees the text, then nlohmann's (iterative) SAX parser feeding a DOM builder that
// refuses duplicate keys, naming the object they are in by its key path.
#include "base/json_text.h"

#include <string>
#include <utility>
#include <vector>

#include "base/file_util.h"
#include "base/json_values.h"

namespace strata {
namespace {

using json = nlohmann::json;

constexpr size_t kNone = std::string_view::npos;

// The offset of the bracket that opens nesting level `max_depth` + 1, or kNone. Skips strings
// (and comments when `comments`) exactly as nlohmann's lexer does, so that for any text the
// parser accepts the count is the parser's nesting depth. Malformed text may be miscounted; the
// parser refuses it anyway, and the builder below checks the depth again.
size_t FindTooDeep(std::string_view text, int max_depth, bool comments) {
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
    } else if (comments && c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      i = text.find_first_of(std::string_view("\n\r\0", 3), i + 2);  // the lexer's line ends
      if (i == kNone) return kNone;
    } else if (comments && c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      i = text.find("*/", i + 2);
      if (i == kNone) return kNone;
      ++i;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      if (--depth < 0) return kNone;  // unbalanced: a syntax error the parser reports
    }
  }
  return kNone;
}

// nlohmann's description of a parse error detected after reading `position` bytes, as
// "not valid JSON at byte offset N (line L, column C): what", with bytes outside printable ASCII
// (the offending byte is often one: invalid UTF-8) written as \xNN. `position` kNone:
// unknown.
std::string DescribeParseError(std::string_view what, size_t position) {
  if (!what.empty() && what.front() == '[') {  // "[json.exception.parse_error.101] "
    if (size_t end = what.find("] "); end != kNone) what.remove_prefix(end + 2);
  }
  std::string where;
  if (position != kNone)
    where = " at byte offset " + std::to_string(position > 0 ? position - 1 : 0);
  constexpr std::string_view kAt = "parse error at ";
  if (what.substr(0, kAt.size()) == kAt) {
    if (size_t colon = what.find(": "); colon != kNone) {
      where += " (" + std::string(what.substr(kAt.size(), colon - kAt.size())) + ")";
      what.remove_prefix(colon + 2);
    }
  }
  std::string out = "not valid JSON" + where + ": ";
  for (unsigned char c : what) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

// A nlohmann SAX handler that builds the document as nlohmann's own DOM parser does, and stops at
// the first duplicate key or at nesting deeper than the limit, keeping the reason.
class Builder {
 public:
  explicit Builder(int max_depth) : max_depth_(max_depth) {}

  json& root() { return root_; }
  const std::string& error() const { return error_; }

  bool null() { return Add(nullptr); }
  bool boolean(bool v) { return Add(v); }
  bool number_integer(json::number_integer_t v) { return Add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Add(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return Add(v); }
  bool string(json::string_t& v) { return Add(std::move(v)); }
  bool binary(json::binary_t& v) { return Add(json::binary(std::move(v))); }
  bool start_object(size_t) { return Open(json::value_t::object); }
  bool start_array(size_t) { return Open(json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(json::string_t& k) {
    json& object = *open_.back().value;
    if (object.contains(k)) {
      error_ = "duplicate key \"" + k + "\" in " +
               (open_.size() == 1 ? std::string("the top-level object") : open_.back().path);
      return false;
    }
    key_ = &object[k];
    key_name_ = std::move(k);
    return true;
  }

  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_ = DescribeParseError(e.what(), position);
    return false;
  }

 private:
  struct Open_ {
    json* value;
    std::string path;  // key path of `value` ("" for the root), for messages
  };

  // Where the next value goes: the root, the end of the open array, or the slot of the last key.
  json* Slot(std::string* path) {
    if (open_.empty()) return &root_;
    Open_& top = open_.back();
    if (top.value->is_array()) {
      if (path != nullptr) *path = top.path + "[" + std::to_string(top.value->size()) + "]";
      top.value->push_back(nullptr);
      return &top.value->back();
    }
    if (path != nullptr) *path = JoinPath(top.path, key_name_);
    return key_;
  }

  template <typename V>
  bool Add(V&& v) {
    *Slot(nullptr) = json(std::forward<V>(v));
    return true;
  }

  bool Open(json::value_t type) {
    if (static_cast<int>(open_.size()) >= max_depth_) {
      error_ = "nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    std::string path;
    json* slot = Slot(&path);
    *slot = json(type);
    open_.push_back({slot, std::move(path)});
    return true;
  }

  bool Close() {
    open_.pop_back();
    return true;
  }

  const int max_depth_;
  json root_;
  std::vector<Open_> open_;
  json* key_ = nullptr;
  std::string key_name_;
  std::string error_;
};

}  // namespace

Result<json> ParseJsonText(std::string_view text, std::string_view source,
                           const JsonReadOptions& options) {
  auto refuse = [&](const std::string& what) {
    return Status(options.code, std::string(source) + ": " + what);
  };
  if (text.size() > options.max_bytes) {
    return refuse(std::to_string(text.size()) + " bytes, more than the limit of " +
                  std::to_string(options.max_bytes));
  }
  // nlohmann takes a NUL byte for the end of the input and would accept "{}\0anything". JSON
  // text never holds one (inside strings it must be escaped).
  if (size_t at = text.find('\0'); at != kNone) {
    return refuse("not valid JSON at byte offset " + std::to_string(at) + ": a NUL byte");
  }
  if (size_t at = FindTooDeep(text, options.max_depth, options.allow_comments); at != kNone) {
    return refuse("nested deeper than " + std::to_string(options.max_depth) + " levels (at byte " +
                  std::to_string(at) + ")");
  }
  Builder builder(options.max_depth);
  bool parsed = false;
  try {  // nlohmann reports JSON errors to the handler; this catches anything else it throws
    parsed = json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json,
                             /*strict=*/true, options.allow_comments);
  } catch (const json::exception& e) {
    return refuse(DescribeParseError(e.what(), kNone));
  }
  if (!parsed) return refuse(builder.error().empty() ? "not valid JSON" : builder.error());
  return std::move(builder.root());
}

Result<json> ReadJsonFile(const std::string& path, const JsonReadOptions& options) {
  std::string text;
  STRATA_RETURN_IF_ERROR(ReadSmallFile(path, options.max_bytes, &text, options.code));
  return ParseJsonText(text, path, options);
}

}  // namespace strata
