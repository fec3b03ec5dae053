//===- Json.cpp - JSON through nlohmann-json's SAX parser -----------------===//
//
// nlohmann::json's lexer and parser (iterative: no recursion on nesting) do
// the syntax: literals, numbers, escapes, surrogate pairs, UTF-8 validation,
// trailing data. The handler below builds the JsonValue tree and adds the
// checks the runtime needs beyond the grammar: duplicate keys are errors,
// nesting is bounded, and every number keeps its literal so integers convert
// exactly. Positions come from an iterator that counts what the lexer read.
//
//===----------------------------------------------------------------------===//

#include "runtime/Json.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <unordered_set>

using namespace fastllm::rt;

const JsonValue *JsonValue::get(std::string_view key) const {
  for (const auto &[name, value] : object)
    if (name == key)
      return &value;
  return nullptr;
}

std::optional<uint64_t> JsonValue::asUint64() const {
  if (kind != Kind::Number || text.empty() ||
      text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE)
    return std::nullopt;
  return v;
}

namespace {

/// Containers may nest 65 deep (a value at depth 64 may be an empty array or
/// object), as the hand-written parser this replaces allowed.
constexpr size_t kMaxDepth = 64;
/// At most this many values (containers, members and elements, the document
/// itself included): the tree costs about 150 bytes a value, so a text of
/// tiny values ("[],[],...") would otherwise cost fifty times its length.
/// Real documents are far below it: a checkpoint manifest holds tens of
/// values per rank, a safetensors header about ten per tensor.
constexpr size_t kMaxValues = size_t(1) << 20;

/// A char iterator that records, in `*read`, how many bytes the lexer has
/// consumed, so that the handler's errors can name a byte position.
class CountingIterator {
public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char *;
  using reference = const char &;

  CountingIterator(const char *p, const char *begin, size_t *read)
      : p(p), begin(begin), read(read) {}
  reference operator*() const { return *p; }
  CountingIterator &operator++() {
    ++p;
    *read = size_t(p - begin);
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator &o) const { return p == o.p; }
  bool operator!=(const CountingIterator &o) const { return p != o.p; }

private:
  const char *p, *begin;
  size_t *read;
};

using Json = nlohmann::json;

/// Builds the JsonValue tree from nlohmann's SAX events.
class TreeBuilder final : public nlohmann::json_sax<Json> {
public:
  explicit TreeBuilder(const size_t *read) : read(read) {}

  JsonValue root;
  std::string error;

  bool null() override { return add(JsonValue()); }
  bool boolean(bool b) override {
    JsonValue v;
    v.kind = JsonValue::Kind::Bool;
    v.boolean = b;
    return add(std::move(v));
  }
  bool number_integer(number_integer_t x) override {
    // Non-negative integers arrive as number_unsigned: a zero here is "-0",
    // which must not read as the unsigned integer 0.
    return number(x == 0 ? "-0" : std::to_string(x));
  }
  bool number_unsigned(number_unsigned_t x) override {
    return number(std::to_string(x));
  }
  bool number_float(number_float_t, const string_t &literal) override {
    // Also integers beyond 64 bits: asUint64 refuses them from the literal.
    return number(literal);
  }
  bool string(string_t &s) override {
    JsonValue v;
    v.kind = JsonValue::Kind::String;
    v.text = std::move(s);
    return add(std::move(v));
  }
  bool binary(binary_t &) override { return fail("binary value", 1); }
  bool start_object(std::size_t) override {
    return open(JsonValue::Kind::Object);
  }
  bool key(string_t &k) override {
    if (!stack.back().keys.insert(k).second)
      return fail(("duplicate key \"" + k + "\"").c_str(), 0);
    stack.back().key = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    return open(JsonValue::Kind::Array);
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &ex) override {
    // "[json.exception.parse_error.101] parse error at line 1, column 4:
    // syntax error while parsing value - unexpected ']'; ..." -> the part
    // after the location, at the offending token's first byte.
    std::string what = ex.what();
    size_t colon = what.find(": ");
    if (colon != std::string::npos)
      what = what.substr(colon + 2);
    // The byte at which the lexer saw the problem (the end of the text when
    // it ran out): `position` counts the bytes it read, less a lookahead it
    // put back. (nlohmann's last-token text is not used: it may hold earlier
    // tokens' characters too.)
    bool atEnd = what.find("unexpected end of input") != std::string::npos;
    // The lexer quotes what it read, which may be any byte of a hostile
    // file: shown escaped, so that a message is plain text.
    what = printable(what, /*asciiOnly=*/true);
    // (At the end, the lexer's count includes the end-of-input marker.)
    error = what + " at byte " +
            std::to_string(atEnd ? *read : position == 0 ? 0 : position - 1);
    return false;
  }

private:
  /// An open container, the keys its members used so far, and the key of
  /// the member being read.
  struct Open {
    JsonValue value;
    std::unordered_set<std::string> keys;
    std::string key;
  };

  bool fail(const char *what, size_t back) {
    error += std::string(what) + " at byte " +
             std::to_string(*read >= back ? *read - back : 0);
    return false;
  }
  bool number(std::string literal) {
    JsonValue v;
    v.kind = JsonValue::Kind::Number;
    v.text = std::move(literal);
    return add(std::move(v));
  }
  /// Counts one more value against kMaxValues.
  bool count() {
    if (++values <= kMaxValues)
      return true;
    return fail(("more than " + std::to_string(kMaxValues) + " JSON values")
                    .c_str(),
                0);
  }
  /// Places `v` in the innermost open container (or as the document);
  /// a container was counted when it opened.
  bool add(JsonValue v, bool counted = false) {
    if (!counted && !count())
      return false;
    if (stack.empty()) {
      root = std::move(v);
      return true;
    }
    JsonValue &parent = stack.back().value;
    if (parent.kind == JsonValue::Kind::Array)
      parent.array.push_back(std::move(v));
    else
      parent.object.emplace_back(std::move(stack.back().key), std::move(v));
    return true;
  }
  bool open(JsonValue::Kind kind) {
    if (stack.size() > kMaxDepth)
      return fail("JSON nested too deeply", 1); // at the bracket itself
    if (!count())
      return false;
    stack.emplace_back();
    stack.back().value.kind = kind;
    return true;
  }
  bool close() {
    JsonValue v = std::move(stack.back().value);
    stack.pop_back();
    return add(std::move(v), /*counted=*/true);
  }

  const size_t *read;
  size_t values = 0;
  std::vector<Open> stack;
};

} // namespace

Expected<JsonValue> fastllm::rt::parseJson(std::string_view text) {
  // nlohmann's lexer takes a NUL byte for the end of the input: text after
  // one would be passed over unread ("{...}\0anything" parsed). No JSON
  // holds a raw NUL (in a string it is written \u0000).
  if (size_t nul = text.find('\0'); nul != std::string_view::npos)
    return errorf("a NUL byte at byte %zu", nul);
  // nlohmann passes over a UTF-8 byte-order mark; Python's json (and so
  // tools/fastllm_weights.py and the safetensors library) refuse one: one
  // rule for every reader of the same files.
  if (text.substr(0, 3) == "\xEF\xBB\xBF")
    return errorf("a UTF-8 byte-order mark at byte 0");
  size_t read = 0;
  const char *begin = text.data(), *end = begin + text.size();
  TreeBuilder builder(&read);
  bool ok = Json::sax_parse(CountingIterator(begin, begin, &read),
                            CountingIterator(end, begin, &read), &builder,
                            nlohmann::detail::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  if (!ok)
    return Status::error(builder.error.empty() ? "invalid JSON"
                                               : builder.error);
  return std::move(builder.root);
}

namespace {
/// The length of the valid UTF-8 character at the start of `s` (RFC 3629:
/// no overlong forms, no surrogates, at most U+10FFFF), or 0.
size_t utf8CharLength(std::string_view s) {
  auto byte = [&](size_t i) { return i < s.size() ? uint8_t(s[i]) : 0; };
  auto tail = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xbf) {
    return byte(i) >= lo && byte(i) <= hi;
  };
  uint8_t c = byte(0);
  if (c < 0x80)
    return s.empty() ? 0 : 1;
  if (c >= 0xc2 && c <= 0xdf)
    return tail(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    bool second = c == 0xe0   ? tail(1, 0xa0)
                  : c == 0xed ? tail(1, 0x80, 0x9f)
                              : tail(1);
    return second && tail(2) ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    bool second = c == 0xf0   ? tail(1, 0x90)
                  : c == 0xf4 ? tail(1, 0x80, 0x8f)
                              : tail(1);
    return second && tail(2) && tail(3) ? 4 : 0;
  }
  return 0;
}
} // namespace

std::string fastllm::rt::utf8Text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (size_t n = utf8CharLength(s.substr(i))) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", uint8_t(s[i]));
      out += hex;
      ++i;
    }
  }
  return out;
}

std::string fastllm::rt::hexBytes(std::string_view s) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * s.size());
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::optional<std::string> fastllm::rt::fromHexBytes(std::string_view hex) {
  auto value = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                                 : -1;
  };
  if (hex.size() % 2)
    return std::nullopt;
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = value(hex[i]), lo = value(hex[i + 1]);
    if (hi < 0 || lo < 0)
      return std::nullopt;
    out += char(hi * 16 + lo);
  }
  return out;
}

std::string fastllm::rt::jsonQuote(std::string_view raw) {
  static const char hex[] = "0123456789abcdef";
  const std::string s = utf8Text(raw);
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = c;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}
