//===- SafetensorsTest.cpp - safetensors files and their JSON headers -----===//
//
// Weight files come from users and from PyTorch: what we write must be the
// format the `safetensors` package reads, and a damaged header must give an
// error naming the problem, never a crash or an out-of-range read.
//
//===----------------------------------------------------------------------===//

#include "FakeModel.h"
#include "TestUtil.h"

#include "runtime/Json.h"
#include "runtime/Safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace fastllm::rt;
using namespace fastllm::rt::test;

namespace {

/// A file with `header` as its JSON header and `dataBytes` zero bytes of data.
std::string rawFile(const std::string &header, size_t dataBytes) {
  uint64_t size = header.size();
  std::string bytes(reinterpret_cast<const char *>(&size), 8);
  return bytes + header + std::string(dataBytes, '\0');
}

std::string openError(const std::string &path) {
  Expected<SafetensorsReader> r = SafetensorsReader::open(path);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

TEST(Json, ParsesTheHeaderSubset) {
  Expected<JsonValue> v = parseJson(
      R"( {"a\"b": {"dtype": "F32", "shape": [2, 0], "n": -1.5e3},
           "u": "\u00e9\ud83d\ude00\n", "t": [true, false, null]} )");
  ASSERT_TRUE(v.ok()) << v.status().message();
  const JsonValue *a = v->get("a\"b");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->get("dtype")->text, "F32");
  EXPECT_EQ(a->get("shape")->array[0].asUint64(), 2u);
  EXPECT_EQ(a->get("shape")->array[1].asUint64(), 0u);
  EXPECT_EQ(a->get("n")->kind, JsonValue::Kind::Number);
  EXPECT_FALSE(a->get("n")->asUint64());
  EXPECT_EQ(v->get("u")->text, "\xc3\xa9\xf0\x9f\x98\x80\n");
  EXPECT_TRUE(v->get("t")->array[0].boolean);
  EXPECT_EQ(v->get("t")->array[2].kind, JsonValue::Kind::Null);
  EXPECT_EQ(parseJson("18446744073709551615")->asUint64(), UINT64_MAX);
  EXPECT_FALSE(parseJson("18446744073709551616")->asUint64());
  EXPECT_EQ(jsonQuote("a\"\\\x01"), "\"a\\\"\\\\\\u0001\"");
}

TEST(Json, RejectsMalformedText) {
  for (const char *bad :
       {"", "{", "{\"a\":}", "{\"a\" 1}", "[1,]", "[1 2]", "{\"a\":1,}",
        "\"abc", "\"\\x\"", "\"\\ud800\"", "\"a\nb\"", "01", "-", "1.", "1e",
        "tru", "{} x", "{\"a\":1,\"a\":2}", "{1:2}"})
    EXPECT_FALSE(parseJson(bad).ok()) << bad;
  // The lexer would stop at a NUL as at the end: what follows is refused.
  EXPECT_EQ(parseJson(std::string("{}\0{\"x", 5)).status().message(),
            "a NUL byte at byte 2");
  EXPECT_EQ(parseJson(std::string("{\"a\0\":1}", 9)).status().message(),
            "a NUL byte at byte 3");
  EXPECT_EQ(parseJson("\xEF\xBB\xBF{}").status().message(),
            "a UTF-8 byte-order mark at byte 0");
  Expected<JsonValue> deep = parseJson(std::string(100000, '['));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().message(), "JSON nested too deeply at byte 65");
  EXPECT_EQ(parseJson(std::string(100000, '{')).status().message(),
            "syntax error while parsing object key - unexpected '{'; "
            "expected string literal at byte 1");
  std::string objects;
  for (int i = 0; i < 100000; ++i)
    objects += "{\"a\":";
  EXPECT_EQ(parseJson(objects).status().message(),
            "JSON nested too deeply at byte 325");
  // 2^20 values (the array counts one) are read; one more is refused where
  // it starts, so that text of tiny values cannot cost fifty times its size.
  std::string values = "[";
  for (int i = 1; i < (1 << 20); ++i)
    values += i > 1 ? ",0" : "0";
  values += "]";
  Expected<JsonValue> most = parseJson(values);
  ASSERT_TRUE(most.ok()) << most.status().message();
  EXPECT_EQ(most->array.size(), size_t(1 << 20) - 1);
  values.insert(values.size() - 1, ",[]");
  EXPECT_EQ(parseJson(values).status().message(),
            "more than 1048576 JSON values at byte " +
                std::to_string(values.size() - 2));
  // 65 levels are allowed, as before.
  EXPECT_TRUE(parseJson(std::string(65, '[') + std::string(65, ']')).ok());
  EXPECT_EQ(parseJson("[1,]").status().message(),
            "syntax error while parsing value - unexpected ']'; expected '[', "
            "'{', or a literal at byte 3");
  EXPECT_EQ(parseJson("{\"a\":1,\n \"a\":2}").status().message(),
            "duplicate key \"a\" at byte 12");
  // A byte the lexer quotes is shown escaped.
  std::string raw = parseJson("\xff").status().message();
  EXPECT_NE(raw.find("\\xff"), std::string::npos) << raw;
  EXPECT_EQ(raw.find('\xff'), std::string::npos) << raw;
  // Strings must be UTF-8; trailing data is an error.
  EXPECT_FALSE(parseJson("\"\xff\"").ok());
  EXPECT_FALSE(parseJson("\"\xc3\"").ok());
  EXPECT_FALSE(parseJson("[] []").ok());
}

/// Errors name the byte at which the parser found the problem.
TEST(Json, ErrorsNameTheOffendingByte) {
  for (auto [text, at] : std::vector<std::pair<const char *, const char *>>{
           {"[1 2]", "unexpected number literal; expected ']' at byte 3"},
           {"{\"a\" 1}", "unexpected number literal; expected ':' at byte 5"},
           {"[\"ok\", \"\\x\"]", "invalid string: forbidden character "
                                 "after backslash; last read: "
                                 "'\"\\x' at byte 9"},
           {"[tru]", "invalid literal; last read: '[tru]' at byte 4"},
           {"{} x", "expected end of input at byte 3"},
           {"[1", "unexpected end of input; expected ']' at byte 2"}}) {
    std::string message = parseJson(text).status().message();
    std::string end = at;
    EXPECT_TRUE(message.size() >= end.size() &&
                message.compare(message.size() - end.size(), end.size(), end) ==
                    0)
        << text << ": " << message;
  }
}

TEST(Json, IntegersAreExactOrRefused) {
  // Offsets beyond 2^53 survive exactly; anything but a plain non-negative
  // integer literal is not an unsigned integer.
  EXPECT_EQ(parseJson("9007199254740993")->asUint64(), 9007199254740993u);
  for (const char *notUint : {"-1", "-0", "1.0", "1e3", "0.5", "1E+2",
                              "99999999999999999999", "\"7\"", "true"})
    EXPECT_FALSE(parseJson(notUint)->asUint64()) << notUint;
  // Numbers keep their literal (the metrics tests compare them as text).
  EXPECT_EQ(parseJson("1.2345678901234567e-05")->text,
            "1.2345678901234567e-05");
  EXPECT_EQ(parseJson("-42")->text, "-42");
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  TempDir dir;
  std::vector<float> matrix = {1, -2, 3.5f, 4, 5, 6};
  float scalar = 0.25f;
  std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(writeSafetensors(path,
                               {{"layer.0/w\"q", {2, 3}, matrix.data()},
                                {"s", {}, &scalar},
                                {"empty", {0, 4}, nullptr}},
                               {{"format", "pt"}})
                  .ok());
  // Only the final file remains: the temporary one was renamed over it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);

  std::string bytes = readBytes(path);
  uint64_t headerBytes;
  std::memcpy(&headerBytes, bytes.data(), 8);
  EXPECT_EQ(headerBytes % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + headerBytes + 7 * sizeof(float));
  Expected<JsonValue> header = parseJson(bytes.substr(8, headerBytes));
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->get("__metadata__")->get("format")->text, "pt");

  Expected<SafetensorsReader> r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tensors().size(), 3u);
  const TensorEntry *w = r->find("layer.0/w\"q");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->dtype, "F32");
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->end - w->begin, 24u);
  std::vector<float> back(6);
  ASSERT_TRUE(r->readF32("layer.0/w\"q", {2, 3}, back.data()).ok());
  EXPECT_EQ(back, matrix);
  float s = 0;
  ASSERT_TRUE(r->readF32("s", {}, &s).ok());
  EXPECT_EQ(s, 0.25f);
  EXPECT_TRUE(r->readF32("empty", {0, 4}, nullptr).ok());
}

TEST(Safetensors, CopiesTensorsFromTheFilesHoldingThem) {
  // A tensor whose bytes also lie in a file is copied from there by the
  // kernel; what the kernel cannot copy (a file shorter than said, a pipe)
  // is written from memory. Offsets need not be aligned.
  TempDir dir;
  std::vector<float> a(1000), b(600);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = 0.5f * float(i) - 7.0f;
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = -0.25f * float(i);
  std::string junk(13, 'x');
  std::string source = junk + std::string(reinterpret_cast<char *>(a.data()),
                                          a.size() * sizeof(float));
  // b's file holds only its first half.
  source += std::string(reinterpret_cast<char *>(b.data()), 300 * 4);
  std::string sourcePath = dir.file("source.bin");
  writeBytes(sourcePath, source);
  int fd = ::open(sourcePath.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  std::vector<float> c = {1, 2, 3};

  TensorRef ta{"a", {10, 100}, a.data()};
  ta.source = [&] { return std::pair<int, uint64_t>{fd, 13}; };
  TensorRef tb{"b", {600}, b.data()};
  tb.source = [&] {
    return std::pair<int, uint64_t>{fd, 13 + a.size() * sizeof(float)};
  };
  TensorRef tc{"c", {3}, c.data()};
  tc.source = [&] { return std::pair<int, uint64_t>{pipeFds[0], 0}; };
  std::string path = dir.file("t.safetensors"),
              plain = dir.file("p.safetensors");
  ASSERT_TRUE(writeSafetensors(path, {ta, tb, tc}).ok());
  ::close(fd);
  ::close(pipeFds[0]);
  ::close(pipeFds[1]);
  ASSERT_TRUE(writeSafetensors(plain, {{"a", {10, 100}, a.data()},
                                       {"b", {600}, b.data()},
                                       {"c", {3}, c.data()}})
                  .ok());
  EXPECT_EQ(readBytes(path), readBytes(plain));
}

TEST(Safetensors, OverwritesWholeFilesAndReportsUnwritableOnes) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  std::vector<float> big(1000, 1.0f), small = {2.0f};
  ASSERT_TRUE(writeSafetensors(path, {{"x", {1000}, big.data()}}).ok());
  ASSERT_TRUE(writeSafetensors(path, {{"x", {1}, small.data()}}).ok());
  Expected<SafetensorsReader> r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok());
  float x;
  ASSERT_TRUE(r->readF32("x", {1}, &x).ok());
  EXPECT_EQ(x, 2.0f);

  Status s = writeSafetensors(dir.file("no/such/folder/t.safetensors"),
                              {{"x", {1}, small.data()}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot create a temporary file beside"),
            std::string::npos);
}

TEST(Safetensors, RejectsTruncatedFiles) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  writeBytes(path, "abc");
  EXPECT_EQ(openError(path),
            "'" + path + "' is not a safetensors file: it is too short");
  std::string file = rawFile("{}", 0);
  writeBytes(path, file.substr(0, 9));
  EXPECT_EQ(openError(path), "'" + path +
                                 "' is not a safetensors file: its header "
                                 "length 2 does not fit its 9 bytes");
  // A header length from a text file: 8 ASCII bytes are a huge number.
  writeBytes(path, "hello world, this is not safetensors");
  EXPECT_NE(openError(path).find("does not fit"), std::string::npos);
  // Data cut short: the tensor's range now ends past the file.
  std::vector<float> v(4, 1.0f);
  ASSERT_TRUE(writeSafetensors(path, {{"x", {4}, v.data()}}).ok());
  std::string whole = readBytes(path);
  writeBytes(path, whole.substr(0, whole.size() - 1));
  EXPECT_EQ(openError(path), "'" + path +
                                 "': tensor 'x' has data_offsets [0, 16], "
                                 "not a range within the 15 data bytes");
}

TEST(Safetensors, RejectsMalformedHeaders) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  struct Case {
    const char *header;
    const char *error;
  } cases[] = {
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4])",
       "malformed safetensors header: syntax error while parsing object - "
       "unexpected end of input; expected '}' at byte 59"},
      {"[1, 2]", "malformed safetensors header: not a JSON object"},
      {R"({"x": 3})", "tensor 'x' is not a JSON object"},
      {R"({"x": {"shape": [1], "data_offsets": [0, 4]}})",
       "tensor 'x' has no string \"dtype\""},
      {R"({"x": {"dtype": "F31", "shape": [1], "data_offsets": [0, 4]}})",
       "tensor 'x' has unknown dtype \"F31\""},
      {R"({"x": {"dtype": "F32", "data_offsets": [0, 4]}})",
       "tensor 'x' has no \"shape\" array"},
      {R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
       "tensor 'x' has a shape entry that is not a non-negative integer"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})",
       "tensor 'x' has no \"data_offsets\" [begin, end] of non-negative "
       "integers"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})",
       "tensor 'x' has data_offsets [8, 4], not a range within the 16 data "
       "bytes"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 20]}})",
       "tensor 'x' has data_offsets [4, 20], not a range within the 16 data "
       "bytes"},
      {R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})",
       "tensor 'x' has 4 data bytes, which do not hold F32 of shape [2]"},
      {R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 4],
                 "data_offsets": [0, 0]}})",
       "tensor 'x' has 0 data bytes, which do not hold F32 of shape "
       "[4611686018427387904, 4]"},
      {R"({"__metadata__": [], "x": {}})",
       "__metadata__ is not a JSON object of strings"},
      {R"({"__metadata__": {"a": 1}})",
       "__metadata__ is not a JSON object of strings"},
      // Names and dtypes are the file's bytes: shown escaped, one line,
      // not cut at a NUL.
      {R"({"a\u0000b\nc": {"dtype": "F\u001b[2J", "shape": [1],
                 "data_offsets": [0, 4]}})",
       "tensor 'a\\x00b\\x0ac' has unknown dtype \"F\\x1b[2J\""},
  };
  for (const Case &c : cases) {
    writeBytes(path, rawFile(c.header, 16));
    EXPECT_EQ(openError(path), "'" + path + "'" +
                                   (c.error[0] == 'm' ? " has a " : ": ") +
                                   c.error)
        << c.header;
  }
}

TEST(Safetensors, SurvivesRandomCorruption) {
  // Flipped header bytes and truncations must give an error or a header
  // whose every range lies inside the file; never a crash (run under ASan).
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  std::vector<float> a(6, 1.0f), b(3, 2.0f);
  ASSERT_TRUE(
      writeSafetensors(path, {{"a", {2, 3}, a.data()}, {"bb", {3}, b.data()}})
          .ok());
  const std::string valid = readBytes(path);
  std::mt19937 rng(11);
  const char alphabet[] = "{}[]\",:0123456789-eE.FIU \\u";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = valid;
    if (iter % 4 == 0)
      bytes.resize(rng() % bytes.size());
    for (int k = rng() % 4; k >= 0 && bytes.size() > 8; --k)
      bytes[8 + rng() % std::min<size_t>(bytes.size() - 8, 120)] =
          alphabet[rng() % (sizeof(alphabet) - 1)];
    writeBytes(path, bytes);
    Expected<SafetensorsReader> r = SafetensorsReader::open(path);
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty());
      continue;
    }
    for (const TensorEntry &e : r->tensors()) {
      ASSERT_LE(e.end, bytes.size());
      if (e.dtype == "F32") {
        std::vector<float> out((e.end - e.begin) / 4);
        EXPECT_TRUE(r->readF32(e.name, e.shape, out.data()).ok());
      }
    }
  }
}

TEST(Safetensors, ReadF32ChecksNameDtypeAndShape) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  writeBytes(path, rawFile(R"({"h": {"dtype": "F16", "shape": [2], )"
                           R"("data_offsets": [0, 4]}, )"
                           R"("f": {"dtype": "F32", "shape": [3, 1], )"
                           R"("data_offsets": [4, 16]}})",
                           16));
  Expected<SafetensorsReader> r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  float out[3];
  EXPECT_EQ(r->readF32("g", {3}, out).message(),
            "'" + path + "' has no tensor 'g'");
  EXPECT_EQ(r->readF32("h", {2}, out).message(),
            "'" + path + "': tensor 'h' has dtype F16, expected F32");
  EXPECT_EQ(r->readF32("f", {1, 3}, out).message(),
            "'" + path + "': tensor 'f' has shape [3, 1], expected [1, 3]");
  EXPECT_TRUE(r->readF32("f", {3, 1}, out).ok());
}

TEST(Safetensors, LoadParamsNeedsEveryPlanParameter) {
  TempDir dir;
  fake::setShape(2, 3);
  const fastllm::rt::PlanInfo &plan = *fastllm_plan();
  // Loading writes the parameters only: padding keeps what was there.
  std::vector<float> flat(fake::kParamElements, -1.0f);
  for (int32_t p = 0; p < plan.numParams; ++p)
    for (int64_t i = 0; i < plan.params[p].numel; ++i)
      flat[plan.params[p].offset + i] = float(plan.params[p].offset + i);
  std::string all = dir.file("all.safetensors");
  ASSERT_TRUE(saveParams(all, plan, flat.data(), false).ok());
  std::vector<float> back(flat.size(), -1);
  ASSERT_TRUE(loadParams(all, plan, back.data()).ok());
  EXPECT_EQ(back, flat);

  // The gradient dump leaves the frozen "code" out, so it cannot seed a run.
  std::string trainable = dir.file("trainable.safetensors");
  ASSERT_TRUE(saveParams(trainable, plan, flat.data(), true).ok());
  Expected<SafetensorsReader> r = SafetensorsReader::open(trainable);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tensors().size(), 2u);
  EXPECT_EQ(loadParams(trainable, plan, back.data()).message(),
            "'" + trainable + "' has no tensor 'code'");

  // NaN anywhere, or an infinity in a trained parameter, is damage; a
  // frozen tensor may hold -inf (a mask).
  for (int32_t p = 0; p < plan.numParams; ++p) {
    const fastllm::rt::ParamInfo &info = plan.params[p];
    for (float bad : {std::nanf(""), -INFINITY}) {
      std::vector<float> damaged = flat;
      damaged[info.offset + info.numel - 1] = bad;
      std::string path = dir.file("damaged.safetensors");
      ASSERT_TRUE(saveParams(path, plan, damaged.data(), false).ok());
      std::string message = loadParams(path, plan, back.data()).message();
      if (std::isinf(bad) && !info.trainable) {
        EXPECT_EQ(message, "") << paramName(info);
        continue;
      }
      EXPECT_EQ(message, "'" + path + "': tensor '" + paramName(info) +
                             "' holds " + (std::isnan(bad) ? "NaN" : "an infinity") +
                             " at element " + std::to_string(info.numel - 1) +
                             ": " +
                             (std::isnan(bad) ? "the weights are damaged"
                                              : "a trained parameter must be "
                                                "finite"));
    }
  }
}

} // namespace
