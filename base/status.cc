#include "base/status.h"

#include <cerrno>
#include <cstring>

namespace strata {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kIoError:
      return "io_error";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kOutOfRange:
      return "out_of_range";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kCudaError:
      return "cuda_error";
    case StatusCode::kDataLoss:
      return "data_loss";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message, int sys_errno) {
  if (code != StatusCode::kOk) {
    rep_ = std::make_unique<Rep>(Rep{code, sys_errno, std::move(message)});
  }
}

Status::Status(const Status& other)
    : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
  return *this;
}

bool Status::retryable() const {
  const int e = sys_errno();
  return e == EAGAIN || e == EINTR || e == EBUSY;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(StatusCodeName(rep_->code));
  out += ": ";
  out += rep_->message;
  return out;
}

Status Status::WithContext(std::string_view context) const& {
  Status copy(*this);
  return std::move(copy).WithContext(context);
}

Status Status::WithContext(std::string_view context) && {
  if (rep_) {
    std::string msg(context);
    msg += ": ";
    msg += rep_->message;
    rep_->message = std::move(msg);
  }
  return std::move(*this);
}

bool operator==(const Status& a, const Status& b) {
  return a.code() == b.code() && a.sys_errno() == b.sys_errno() && a.message() == b.message();
}

Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

Status IoErrorFromErrno(int err, std::string message) {
  char buf[128];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  message += ": ";
  message += text;
  message += " (errno ";
  message += std::to_string(err);
  message += ")";
  return {StatusCode::kIoError, std::move(message), err};
}

}  // namespace strata
