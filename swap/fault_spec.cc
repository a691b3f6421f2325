#include "swap/fault_spec.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "base/env.h"
#include "base/logging.h"

namespace strata {
namespace {

constexpr FaultKind kKinds[] = {FaultKind::kEio,           FaultKind::kEnospc, FaultKind::kEagain,
                                FaultKind::kShortTransfer, FaultKind::kEof,    FaultKind::kLatency,
                                FaultKind::kFlip};

bool ParseUint(std::string_view text, uint64_t* out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

Result<FaultRule> ParseRule(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("fault rule '" + std::string(text) + "': " + std::string(why) +
                                " (want KIND:read|write|any[@FILE]:N[:BIT], e.g. eio:read:5 or "
                                "flip:write@optimizer:3)");
  };
  const size_t a = text.find(':');
  const size_t b = a == std::string_view::npos ? a : text.find(':', a + 1);
  if (b == std::string_view::npos) return bad("not three fields");
  const size_t c = text.find(':', b + 1);
  const std::string_view kind = text.substr(0, a);
  std::string_view direction = text.substr(a + 1, b - a - 1);
  const std::string_view count = text.substr(b + 1, c == std::string_view::npos ? c : c - b - 1);
  FaultRule rule;
  if (const size_t at = direction.find('@'); at != std::string_view::npos) {
    rule.file = std::string(direction.substr(at + 1));
    direction = direction.substr(0, at);
    if (rule.file.empty()) return bad("empty FILE after '@'");
    if (rule.file.find('/') != std::string::npos) return bad("FILE is a file name, not a path");
  }
  bool known = false;
  for (FaultKind k : kKinds) {
    if (FaultKindName(k) == kind) {
      rule.kind = k;
      known = true;
    }
  }
  if (!known) return bad("unknown kind '" + std::string(kind) + "'");
  if (direction == "read") {
    rule.op = IoOp::kRead;
  } else if (direction == "write") {
    rule.op = IoOp::kWrite;
  } else if (direction != "any") {
    return bad("unknown direction '" + std::string(direction) + "'");
  }
  uint64_t n = 0;
  if (!ParseUint(count, &n) || n == 0) return bad("N must be an integer >= 1");
  rule.request = n - 1;
  if (c != std::string_view::npos) {
    if (rule.kind != FaultKind::kFlip) return bad("only flip takes a fourth field (BIT)");
    if (!ParseUint(text.substr(c + 1), &rule.flip_bit)) return bad("BIT must be an integer >= 0");
  }
  return rule;
}

}  // namespace

Result<std::vector<FaultRule>> ParseFaultSpec(std::string_view spec) {
  std::vector<FaultRule> rules;
  for (size_t begin = 0;;) {  // an empty rule (",," or a trailing comma) is refused as a typo
    const size_t comma = spec.find(',', begin);
    const std::string_view rule =
        spec.substr(begin, comma == std::string_view::npos ? comma : comma - begin);
    STRATA_ASSIGN_OR_RETURN(FaultRule parsed, ParseRule(rule));
    rules.push_back(parsed);
    if (comma == std::string_view::npos) return rules;
    begin = comma + 1;
  }
}

Result<std::unique_ptr<IoBackend>> WrapWithFaultsFromEnv(std::unique_ptr<IoBackend> backend) {
  const char* spec = GetEnv(kIoFaultsEnv);
  if (spec == nullptr || spec[0] == '\0') return backend;
  Result<std::vector<FaultRule>> rules = ParseFaultSpec(spec);
  if (!rules.ok()) return rules.status().WithContext(std::string(kIoFaultsEnv) + "=" + spec);
  STRATA_LOG(kWarning) << kIoFaultsEnv << "=" << spec << ": injecting I/O faults into backend "
                       << backend->name() << " (a test hook)";
  return std::unique_ptr<IoBackend>(
      std::make_unique<FaultInjectingBackend>(std::move(backend), std::move(rules).value()));
}

}  // namespace strata
