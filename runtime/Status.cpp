//===- Status.cpp - errors as values --------------------------------------===//

#include "runtime/Status.h"

#include <cstdarg>
#include <cstdio>

using namespace fastllm::rt;

Status fastllm::rt::errorf(const char *fmt, ...) {
  va_list args, copy;
  va_start(args, fmt);
  va_copy(copy, args);
  int size = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string message(size > 0 ? size : 0, '\0');
  std::vsnprintf(message.data(), message.size() + 1, fmt, args);
  va_end(args);
  return Status::error(std::move(message));
}

std::string fastllm::rt::printable(std::string_view bytes, bool asciiOnly) {
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c != 0x7f && !(asciiOnly && c >= 0x80)) {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}
