//===- Status.h - errors as values for the training runtime -----*- C++ -*-===//
//
// The runtime reports user errors (bad flags, a broken data or weights file,
// a non-finite loss) by returning them: only main() prints and exits, so every
// failure is testable and no library code calls exit() behind a test's back.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_STATUS_H
#define FASTLLM_RUNTIME_STATUS_H

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fastllm::rt {

/// Success, or a failure with a lowercase message that main() prints after
/// "train: error: ".
class [[nodiscard]] Status {
public:
  Status() = default;
  static Status error(std::string message) {
    Status s;
    s.failed = true;
    s.msg = std::move(message);
    return s;
  }
  bool ok() const { return !failed; }
  const std::string &message() const { return msg; }

private:
  bool failed = false;
  std::string msg;
};

/// A failed Status whose message is formatted like printf.
Status errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/// `bytes` as one line of text for a message: control bytes (NUL, newline,
/// escape, ...) and DEL written as \xNN, everything else as it is. Names
/// and values read from a user's file may hold any byte; through "%s" a
/// NUL would cut the message short and a newline or an escape sequence
/// would forge lines of output. With `asciiOnly`, bytes from 0x80 up too
/// (text that may not be UTF-8).
std::string printable(std::string_view bytes, bool asciiOnly = false);

/// A value, or the Status saying why there is none.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : value(std::move(value)) {}
  Expected(Status error) : err(std::move(error)) {
    assert(!err.ok() && "an Expected without a value needs an error");
  }
  bool ok() const { return value.has_value(); }
  explicit operator bool() const { return ok(); }
  T &operator*() { return *value; }
  const T &operator*() const { return *value; }
  T *operator->() { return &*value; }
  const T *operator->() const { return &*value; }
  const Status &status() const { return err; }

private:
  std::optional<T> value;
  Status err;
};

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_STATUS_H
