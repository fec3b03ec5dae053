//===- Json.h - the JSON the runtime reads and writes -----------*- C++ -*-===//
//
// Safetensors headers are JSON, and they come from files the user hands us:
// the parser must reject anything malformed with a message, never crash, and
// keep integers exact (byte offsets do not fit a double's mantissa in general).
// Parsing is nlohmann-json's (Debian's nlohmann-json3-dev, header-only, used
// in Json.cpp only so that this header stays plain C++17 for the generated
// training binaries); this file adds the runtime's checks on top.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_JSON_H
#define FASTLLM_RUNTIME_JSON_H

#include "runtime/Status.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fastllm::rt {

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  /// A String's decoded contents, or a Number's literal as written, so that
  /// integers are converted exactly by the reader that knows their range.
  std::string text;
  std::vector<JsonValue> array;
  /// Members in file order; duplicate keys are rejected by the parser.
  std::vector<std::pair<std::string, JsonValue>> object;

  /// The member named `key` of an Object, or null.
  const JsonValue *get(std::string_view key) const;
  /// The value of a Number that is a non-negative integer within uint64_t.
  std::optional<uint64_t> asUint64() const;
};

/// Parses one JSON document (surrounding whitespace allowed, nothing else
/// after it). Errors give the byte position; a duplicate key in an object is
/// an error; strings must be valid UTF-8; containers nested more than 65
/// deep are an error, not a stack overflow; more than 2^20 values (each
/// container, member and element counts one) are an error, so the tree
/// stays within about 150 MiB whatever the text. Time is linear in the
/// text's length.
Expected<JsonValue> parseJson(std::string_view text);

/// `s` as a JSON string literal, quotes included: always JSON a reader
/// takes, whatever the bytes (utf8Text first).
std::string jsonQuote(std::string_view s);

/// `s` when it is valid UTF-8; otherwise each byte that is not part of a
/// valid UTF-8 character written as the text \xNN (a path or a flag may
/// hold any byte; JSON strings hold UTF-8 only). Not reversible: where the
/// exact bytes matter, keep them another way (hexBytes).
std::string utf8Text(std::string_view s);

/// `s`'s bytes as lower-case hex digits, and back (nullopt for text that
/// is not an even number of hex digits).
std::string hexBytes(std::string_view s);
std::optional<std::string> fromHexBytes(std::string_view hex);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_JSON_H
