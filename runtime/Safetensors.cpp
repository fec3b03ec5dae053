//===- Safetensors.cpp - read and write safetensors files -----------------===//

#include "runtime/Safetensors.h"
#include "runtime/InputFile.h"

#include "runtime/Plan.h"

#include "runtime/Json.h"
#include "runtime/OutputFile.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <set>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace fastllm::rt;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and is copied as is");

namespace {

/// The safetensors reference implementation refuses larger headers; so do we,
/// before allocating for one.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

/// Bytes per element of the dtypes the format defines.
int dtypeSize(const std::string &dtype) {
  static const std::pair<const char *, int> sizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  for (const auto &[name, size] : sizes)
    if (dtype == name)
      return size;
  return 0;
}

std::string shapeString(const std::vector<int64_t> &shape,
                        const char *separator = ", ") {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? separator : "") + std::to_string(shape[i]);
  return s + "]";
}

/// The element count of `shape`, or nothing when it overflows.
std::optional<uint64_t> numElements(const std::vector<int64_t> &shape) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, uint64_t(d), &n))
      return std::nullopt;
  return n;
}

/// Checks one header entry and converts it; `dataBytes` bounds its range.
Expected<TensorEntry> parseEntry(const std::string &name, const JsonValue &v,
                                 uint64_t dataBytes) {
  auto bad = [&](const std::string &what) {
    return Status::error("tensor '" + printable(name) + "' " + what);
  };
  if (v.kind != JsonValue::Kind::Object)
    return bad("is not a JSON object");
  TensorEntry e;
  e.name = name;
  const JsonValue *dtype = v.get("dtype");
  if (!dtype || dtype->kind != JsonValue::Kind::String)
    return bad("has no string \"dtype\"");
  e.dtype = dtype->text;
  int elementSize = dtypeSize(e.dtype);
  if (!elementSize)
    return bad("has unknown dtype \"" + printable(e.dtype) + "\"");
  const JsonValue *shape = v.get("shape");
  if (!shape || shape->kind != JsonValue::Kind::Array)
    return bad("has no \"shape\" array");
  for (const JsonValue &d : shape->array) {
    std::optional<uint64_t> dim = d.asUint64();
    if (!dim || *dim > uint64_t(INT64_MAX))
      return bad("has a shape entry that is not a non-negative integer");
    e.shape.push_back(int64_t(*dim));
  }
  const JsonValue *offsets = v.get("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets && offsets->kind == JsonValue::Kind::Array &&
      offsets->array.size() == 2) {
    begin = offsets->array[0].asUint64();
    end = offsets->array[1].asUint64();
  }
  if (!begin || !end)
    return bad("has no \"data_offsets\" [begin, end] of non-negative integers");
  e.begin = *begin;
  e.end = *end;
  if (e.begin > e.end || e.end > dataBytes)
    return bad("has data_offsets [" + std::to_string(e.begin) + ", " +
               std::to_string(e.end) + "], not a range within the " +
               std::to_string(dataBytes) + " data bytes");
  std::optional<uint64_t> numel = numElements(e.shape);
  uint64_t bytes;
  if (!numel || __builtin_mul_overflow(*numel, uint64_t(elementSize), &bytes) ||
      bytes != e.end - e.begin)
    return bad("has " + std::to_string(e.end - e.begin) +
               " data bytes, which do not hold " + e.dtype + " of shape " +
               shapeString(e.shape));
  return e;
}

} // namespace

Expected<SafetensorsReader> SafetensorsReader::open(const std::string &path) {
  SafetensorsReader r;
  r.path = path;
  const char *file = path.c_str();
  // Never blocks (a FIFO) or reads a device: a regular file, or an error.
  Expected<OpenedInput> in = openInput(path, "'" + path + "'");
  if (!in)
    return notFound(in.status())
               ? errorf("cannot open '%s': it does not exist", file)
               : in.status();
  r.fd = dup(in->fd.get());
  if (r.fd < 0)
    return errorf("cannot open '%s': %s", file, std::strerror(errno));
  uint64_t fileBytes = uint64_t(in->size);
  uint64_t headerBytes;
  if (fileBytes < 8 || !readAt(r.fd, &headerBytes, 8, 0))
    return errorf("'%s' is not a safetensors file: it is too short", file);
  if (headerBytes > fileBytes - 8 || headerBytes > kMaxHeaderBytes)
    return errorf("'%s' is not a safetensors file: its header length %llu "
                  "does not fit its %llu bytes",
                  file, (unsigned long long)headerBytes,
                  (unsigned long long)fileBytes);
  std::string header(headerBytes, '\0');
  if (!readAt(r.fd, header.data(), headerBytes, 8))
    return errorf("cannot read '%s': %s", file, std::strerror(errno));
  Expected<JsonValue> json = parseJson(header);
  if (!json)
    return errorf("'%s' has a malformed safetensors header: %s", file,
                  json.status().message().c_str());
  if (json->kind != JsonValue::Kind::Object)
    return errorf("'%s' has a malformed safetensors header: not a JSON object",
                  file);
  r.dataStart = 8 + headerBytes;
  for (const auto &[name, value] : json->object) {
    if (name == "__metadata__") {
      bool strings = value.kind == JsonValue::Kind::Object;
      for (const auto &member : value.object)
        strings = strings && member.second.kind == JsonValue::Kind::String;
      if (!strings)
        return errorf("'%s': __metadata__ is not a JSON object of strings",
                      file);
      continue;
    }
    Expected<TensorEntry> entry =
        parseEntry(name, value, fileBytes - r.dataStart);
    if (!entry)
      return errorf("'%s': %s", file, entry.status().message().c_str());
    r.entries.push_back(std::move(*entry));
  }
  // Each tensor's bytes are its own: two tensors sharing bytes would load
  // as aliases of one another (the format forbids it).
  std::vector<const TensorEntry *> byStart;
  for (const TensorEntry &e : r.entries)
    if (e.end > e.begin) // an empty tensor holds no bytes to share
      byStart.push_back(&e);
  std::sort(byStart.begin(), byStart.end(),
            [](const TensorEntry *a, const TensorEntry *b) {
              return a->begin < b->begin;
            });
  for (size_t i = 1; i < byStart.size(); ++i)
    if (byStart[i]->begin < byStart[i - 1]->end)
      return errorf("'%s': tensors '%s' and '%s' overlap in the file (bytes "
                    "%llu..%llu and %llu..%llu of the data)",
                    file, printable(byStart[i - 1]->name).c_str(),
                    printable(byStart[i]->name).c_str(),
                    (unsigned long long)byStart[i - 1]->begin,
                    (unsigned long long)byStart[i - 1]->end,
                    (unsigned long long)byStart[i]->begin,
                    (unsigned long long)byStart[i]->end);
  return r;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader &&other) noexcept {
  *this = std::move(other);
}

SafetensorsReader &
SafetensorsReader::operator=(SafetensorsReader &&other) noexcept {
  std::swap(path, other.path);
  std::swap(fd, other.fd);
  std::swap(dataStart, other.dataStart);
  std::swap(entries, other.entries);
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd >= 0)
    ::close(fd);
}

const TensorEntry *SafetensorsReader::find(const std::string &name) const {
  for (const TensorEntry &e : entries)
    if (e.name == name)
      return &e;
  return nullptr;
}

Status SafetensorsReader::readF32(const std::string &name,
                                  const std::vector<int64_t> &shape,
                                  float *out) const {
  const char *file = path.c_str();
  const TensorEntry *e = find(name);
  if (!e)
    return errorf("'%s' has no tensor '%s'", file, name.c_str());
  if (e->dtype != "F32")
    return errorf("'%s': tensor '%s' has dtype %s, expected F32", file,
                  name.c_str(), e->dtype.c_str());
  if (e->shape != shape)
    return errorf("'%s': tensor '%s' has shape %s, expected %s", file,
                  name.c_str(), shapeString(e->shape).c_str(),
                  shapeString(shape).c_str());
  if (!readAt(fd, out, e->end - e->begin, dataStart + e->begin))
    return errorf("cannot read tensor '%s' from '%s'", name.c_str(), file);
  return Status();
}

Status fastllm::rt::writeSafetensors(
    const std::string &path, const std::vector<TensorRef> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata,
    WrittenFile *written, bool durable, bool replace) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i)
      header += (i ? "," : "") + jsonQuote(metadata[i].first) + ":" +
                jsonQuote(metadata[i].second);
    header += "}";
  }
  uint64_t offset = 0;
  for (const TensorRef &t : tensors) {
    uint64_t bytes = *numElements(t.shape) * sizeof(float);
    header += (header.size() > 1 ? "," : "") + jsonQuote(t.name) +
              ":{\"dtype\":\"F32\",\"shape\":" + shapeString(t.shape, ",") +
              ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  // Pad with spaces, as the reference writer does, so the data is aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t headerBytes = header.size();

  OutputFile file(path, durable, replace);
  bool ok = file.open() && file.write(&headerBytes, 8) &&
            file.write(header.data(), headerBytes);
  std::vector<float> buffer;
  for (const TensorRef &t : tensors) {
    if (!ok)
      break;
    uint64_t count = *numElements(t.shape);
    if (t.data) {
      size_t bytes = count * sizeof(float), copied = 0;
      auto [fd, offset] =
          t.source ? t.source() : std::pair<int, uint64_t>{-1, 0};
      if (fd >= 0)
        copied = file.copyFrom(fd, offset, bytes);
      ok = copied != SIZE_MAX &&
           file.write(static_cast<const char *>(t.data) + copied,
                      bytes - copied);
    } else {
      // Whole rows of the last dim, about kWriteBufferBytes at a time.
      uint64_t row =
          t.shape.empty() ? 1 : uint64_t(std::max<int64_t>(t.shape.back(), 1));
      uint64_t chunk =
          std::max<uint64_t>(kWriteBufferBytes / sizeof(float) / row, 1) * row;
      for (uint64_t begin = 0; ok && begin < count; begin += chunk) {
        uint64_t n = std::min(chunk, count - begin);
        buffer.resize(std::min(chunk, count));
        t.read(begin, n, buffer.data());
        ok = file.write(buffer.data(), n * sizeof(float));
      }
    }
    if (ok && t.written)
      t.written();
  }
  if (!ok || !file.commit())
    return Status::error(file.error());
  if (written) {
    written->tensors = int64_t(tensors.size());
    written->bytes = int64_t(8 + headerBytes + offset);
  }
  return Status();
}

Status fastllm::rt::loadParams(const std::string &path, const PlanInfo &plan,
                               float *params, float *frozen, Which which,
                               std::vector<std::string> *unused) {
  Expected<SafetensorsReader> reader = SafetensorsReader::open(path);
  if (!reader)
    return reader.status();
  if (unused) {
    std::set<std::string> names;
    for (int32_t i = 0; i < plan.numParams; ++i)
      names.insert(paramName(plan.params[i]));
    for (const TensorEntry &e : reader->tensors())
      if (!names.count(e.name))
        unused->push_back(e.name);
  }
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    const bool frozenArray = inFrozenArray(plan, p);
    if (which == Which::Frozen && !frozenArray)
      continue;
    float *into = frozenArray ? frozen : params;
    if (!into)
      return errorf("no array to load parameter '%s' into",
                    paramName(p).c_str());
    std::vector<int64_t> shape(p.shape, p.shape + p.rank);
    if (Status s = reader->readF32(paramName(p), shape, into + p.offset);
        !s.ok())
      return s;
    // A NaN trains into every weight it touches; an infinity in a trained
    // parameter too. (A frozen tensor may hold -inf: a mask.)
    const float *values = into + p.offset;
    for (int64_t k = 0; k < p.numel; ++k)
      if (std::isnan(values[k]) || (p.trainable && std::isinf(values[k])))
        return errorf("'%s': tensor '%s' holds %s at element %lld: %s",
                      path.c_str(), printable(paramName(p)).c_str(),
                      std::isnan(values[k]) ? "NaN" : "an infinity",
                      (long long)k,
                      std::isnan(values[k])
                          ? "the weights are damaged"
                          : "a trained parameter must be finite");
  }
  return Status();
}

Status fastllm::rt::saveParams(const std::string &path, const PlanInfo &plan,
                               const float *flat, bool trainableOnly,
                               const float *frozen, WrittenFile *written,
                               bool replace) {
  std::vector<TensorRef> tensors;
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    if (!p.trainable && trainableOnly)
      continue;
    const float *from = inFrozenArray(plan, p) ? frozen : flat;
    if (!from)
      return errorf("'%s': no frozen array to write parameter '%s' from",
                    path.c_str(), paramName(p).c_str());
    tensors.push_back({paramName(p),
                       std::vector<int64_t>(p.shape, p.shape + p.rank),
                       from + p.offset});
  }
  return writeSafetensors(path, tensors, {{"format", "pt"}}, written,
                          /*durable=*/true, replace);
}
