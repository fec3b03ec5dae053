//===- Json.cpp - the small JSON subset the runtime reads and writes ------===//

#include "runtime/Json.h"

#include <cerrno>
#include <cstdlib>

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

constexpr int kMaxDepth = 64;

class Parser {
public:
  explicit Parser(std::string_view text) : s(text) {}

  Expected<JsonValue> parseDocument() {
    JsonValue v;
    if (!parseValue(v, 0))
      return failure();
    skipSpace();
    if (pos != s.size()) {
      fail("unexpected data after the JSON value");
      return failure();
    }
    return v;
  }

private:
  std::string_view s;
  size_t pos = 0;
  std::string err;

  Status failure() const { return Status::error(err); }
  bool fail(const char *what) {
    err = std::string(what) + " at byte " + std::to_string(pos);
    return false;
  }
  void skipSpace() {
    while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\t' ||
                              s[pos] == '\n' || s[pos] == '\r'))
      ++pos;
  }
  bool consume(char c) {
    skipSpace();
    if (pos < s.size() && s[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }
  bool literal(std::string_view word) {
    if (s.substr(pos, word.size()) != word)
      return fail("invalid literal");
    pos += word.size();
    return true;
  }

  bool parseValue(JsonValue &v, int depth) {
    if (depth > kMaxDepth)
      return fail("JSON nested too deeply");
    skipSpace();
    if (pos == s.size())
      return fail("unexpected end of JSON");
    switch (s[pos]) {
    case '{':
      return parseObject(v, depth);
    case '[':
      return parseArray(v, depth);
    case '"':
      v.kind = JsonValue::Kind::String;
      return parseString(v.text);
    case 't':
      v.kind = JsonValue::Kind::Bool;
      v.boolean = true;
      return literal("true");
    case 'f':
      v.kind = JsonValue::Kind::Bool;
      return literal("false");
    case 'n':
      return literal("null");
    default:
      return parseNumber(v);
    }
  }

  bool parseObject(JsonValue &v, int depth) {
    v.kind = JsonValue::Kind::Object;
    ++pos;
    if (consume('}'))
      return true;
    do {
      skipSpace();
      std::string key;
      if (pos == s.size() || s[pos] != '"')
        return fail("expected a string key");
      if (!parseString(key))
        return false;
      if (v.get(key))
        return fail(("duplicate key \"" + key + "\"").c_str());
      if (!consume(':'))
        return fail("expected ':'");
      v.object.emplace_back(std::move(key), JsonValue());
      if (!parseValue(v.object.back().second, depth + 1))
        return false;
    } while (consume(','));
    return consume('}') || fail("expected ',' or '}'");
  }

  bool parseArray(JsonValue &v, int depth) {
    v.kind = JsonValue::Kind::Array;
    ++pos;
    if (consume(']'))
      return true;
    do {
      v.array.emplace_back();
      if (!parseValue(v.array.back(), depth + 1))
        return false;
    } while (consume(','));
    return consume(']') || fail("expected ',' or ']'");
  }

  bool parseNumber(JsonValue &v) {
    size_t start = pos;
    auto digits = [&] {
      size_t first = pos;
      while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9')
        ++pos;
      return pos > first;
    };
    if (pos < s.size() && s[pos] == '-')
      ++pos;
    if (pos < s.size() && s[pos] == '0')
      ++pos;
    else if (!digits())
      return fail("invalid value");
    if (pos < s.size() && s[pos] == '.' && (++pos, !digits()))
      return fail("invalid number");
    if (pos < s.size() && (s[pos] == 'e' || s[pos] == 'E')) {
      ++pos;
      if (pos < s.size() && (s[pos] == '+' || s[pos] == '-'))
        ++pos;
      if (!digits())
        return fail("invalid number");
    }
    v.kind = JsonValue::Kind::Number;
    v.text = std::string(s.substr(start, pos - start));
    return true;
  }

  bool hex4(uint32_t &out) {
    out = 0;
    for (int i = 0; i < 4; ++i, ++pos) {
      if (pos == s.size())
        return fail("unterminated \\u escape");
      char c = s[pos];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        return fail("invalid \\u escape");
      out = out * 16 + d;
    }
    return true;
  }

  static void appendUtf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | cp >> 6);
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | cp >> 12);
      out += char(0x80 | (cp >> 6 & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | cp >> 18);
      out += char(0x80 | (cp >> 12 & 0x3F));
      out += char(0x80 | (cp >> 6 & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  bool parseString(std::string &out) {
    ++pos; // the opening quote
    while (true) {
      if (pos == s.size())
        return fail("unterminated string");
      char c = s[pos++];
      if (c == '"')
        return true;
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos == s.size())
        return fail("unterminated string");
      switch (char e = s[pos++]) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        uint32_t cp;
        if (!hex4(cp))
          return false;
        if (cp >= 0xDC00 && cp < 0xE000)
          return fail("unpaired surrogate in \\u escape");
        if (cp >= 0xD800 && cp < 0xDC00) {
          uint32_t low;
          if (s.substr(pos, 2) != "\\u" || (pos += 2, !hex4(low)) ||
              low < 0xDC00 || low >= 0xE000)
            return fail("unpaired surrogate in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        appendUtf8(out, cp);
        break;
      }
      default:
        return fail("invalid escape in string");
      }
    }
  }
};

} // namespace

Expected<JsonValue> fastllm::rt::parseJson(std::string_view text) {
  return Parser(text).parseDocument();
}

std::string fastllm::rt::jsonQuote(std::string_view s) {
  static const char hex[] = "0123456789abcdef";
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
