//===- Weights.cpp - the initial weights as safetensors -------------------===//
//
// writeWeights() hands the runtime's safetensors writer the initial values
// where they lie, never copying a whole tensor: an imported weight's resource
// blob is written from the blob; a folded weight that the importer left in
// the exporter's layout (`model.initial_value_transposed`: external data,
// mapped read-only) is transposed through the writer's bounded buffer; a
// dense attribute (hand-written IR) is converted the same way.
//
// A blob that lies in a read-only file mapping (the importer maps the .onnx
// and its external data) is copied from the file by the kernel
// (copy_file_range) when it is written as it lies, and its pages are given
// back once written when it is transposed, so writing the weights of a model
// larger than memory holds about one tensor at a time.
//
//===----------------------------------------------------------------------===//

#include "codegen/CppEmitter.h"
#include "ir/ModelDialect.h"
#include "runtime/OutputFile.h"
#include "runtime/Safetensors.h"

#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
/// The read-only, private mappings of files that are not programs or
/// libraries, from /proc/self/maps: pages there are clean copies of the
/// file, so giving them back loses nothing (a later read faults them in
/// again), and bytes there can be copied from the file itself. Memory of
/// any other kind (the heap, a library's relocated read-only data) is never
/// given back.
class ReadOnlyFileMappings {
public:
  ReadOnlyFileMappings() {
    auto buffer = llvm::MemoryBuffer::getFileAsStream("/proc/self/maps");
    if (!buffer)
      return;
    maps = std::move(*buffer); // the entries' strings point into it
    SmallVector<StringRef> lines;
    maps->getBuffer().split(lines, '\n', -1, false);
    std::vector<Mapping> entries;
    llvm::StringSet<> executables;
    for (StringRef line : lines) {
      // begin-end perms offset major:minor inode [path]
      SmallVector<StringRef, 6> f;
      line.split(f, ' ', 5, false);
      if (f.size() < 6 || f[4] == "0")
        continue;
      auto [b, e] = f[0].split('-');
      auto [major, minor] = f[3].split(':');
      Mapping m;
      m.perms = f[1];
      m.path = f[5].trim();
      if (b.getAsInteger(16, m.begin) || e.getAsInteger(16, m.end) ||
          f[2].getAsInteger(16, m.fileOffset) ||
          major.getAsInteger(16, m.major) || minor.getAsInteger(16, m.minor) ||
          f[4].getAsInteger(10, m.inode))
        continue;
      if (m.perms.contains('x'))
        executables.insert(m.path);
      entries.push_back(m);
    }
    for (Mapping &m : entries)
      if (m.perms == "r--p" && !executables.contains(m.path))
        ranges.push_back(std::move(m));
  }
  ~ReadOnlyFileMappings() {
    if (openFd >= 0)
      ::close(openFd);
  }

  /// Gives back the whole pages of `data` when it lies in one such mapping.
  void release(const void *data, size_t size) const {
    const Mapping *m = find(data, size);
    if (!m)
      return;
    uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + size;
    uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    uintptr_t first = (begin + page - 1) / page * page;
    uintptr_t last = end / page * page;
    if (first < last)
      ::madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
  }

  /// The file and offset that hold `data` when it lies in one such mapping:
  /// the file at the mapping's path, if it is still the mapped file (same
  /// device and inode); {-1, 0} otherwise. One file is open at a time (the
  /// previous one is closed when another is asked for): a model may lie in
  /// thousands of files, and the descriptor is only needed while the
  /// writer writes the tensor it was asked for.
  std::pair<int, uint64_t> source(const void *data, size_t size) {
    Mapping *m = find(data, size);
    if (!m)
      return {-1, 0};
    if (m != openMapping) {
      if (openFd >= 0)
        ::close(openFd);
      openMapping = m;
      openFd = ::open(m->path.str().c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st;
      if (openFd >= 0 &&
          (::fstat(openFd, &st) != 0 || !S_ISREG(st.st_mode) ||
           ::major(st.st_dev) != m->major || ::minor(st.st_dev) != m->minor ||
           uint64_t(st.st_ino) != m->inode)) {
        ::close(openFd);
        openFd = -1;
      }
    }
    if (openFd < 0)
      return {-1, 0};
    return {openFd,
            m->fileOffset + (reinterpret_cast<uintptr_t>(data) - m->begin)};
  }

private:
  struct Mapping {
    uintptr_t begin = 0, end = 0;
    uint64_t fileOffset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    StringRef perms, path;
  };
  Mapping *find(const void *data, size_t size) const {
    uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + size;
    for (const Mapping &m : ranges)
      if (begin >= m.begin && end <= m.end)
        return const_cast<Mapping *>(&m);
    return nullptr;
  }

  std::unique_ptr<llvm::MemoryBuffer> maps;
  std::vector<Mapping> ranges;
  const Mapping *openMapping = nullptr; ///< whose file openFd is (see source)
  int openFd = -1;
};
} // namespace

/// Elements [begin, begin + count) of the rows x cols matrix whose bytes
/// `stored` hold its transpose (cols x rows), into `out`. `begin` and
/// `count` are whole rows (the writer's chunks are). `stored` may be
/// unaligned (raw data inside a mapped .onnx): it is read with memcpy, 32x32
/// tiles at a time (32 sequential runs of 128 bytes in, 32 out).
static void readTransposed(const char *stored, int64_t rows, int64_t cols,
                           uint64_t begin, uint64_t count, float *out) {
  int64_t r0 = int64_t(begin) / cols, n = int64_t(count) / cols;
  constexpr int64_t kTile = 32;
  float tile[kTile][kTile];
  for (int64_t c0 = 0; c0 < cols; c0 += kTile)
    for (int64_t i0 = 0; i0 < n; i0 += kTile) {
      int64_t nc = std::min(kTile, cols - c0), ni = std::min(kTile, n - i0);
      for (int64_t c = 0; c < nc; ++c)
        std::memcpy(tile[c],
                    stored + ((c0 + c) * rows + r0 + i0) * sizeof(float),
                    ni * sizeof(float));
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t c = 0; c < nc; ++c)
          out[(i0 + i) * cols + c0 + c] = tile[c][i];
    }
}

LogicalResult mlir::fastllm::writeWeights(ModuleOp module, StringRef path) {
  std::vector<::fastllm::rt::TensorRef> tensors;
  ReadOnlyFileMappings mappings;
  // The transposed tensor being written, when read from its file.
  std::vector<char> scratch;
  for (auto p : module.getOps<ParameterOp>()) {
    ElementsAttr init = p.getInitialValueAttr();
    RankedTensorType t = p.getTensorType();
    const size_t bytes = t.getNumElements() * sizeof(float);
    if (!init)
      return p.emitOpError("has no initial value");
    ::fastllm::rt::TensorRef ref{
        p.getSymName().str(),
        std::vector<int64_t>(t.getShape().begin(), t.getShape().end()),
        nullptr};
    if (auto res = dyn_cast<DenseResourceElementsAttr>(init)) {
      AsmResourceBlob *blob = res.getRawHandle().getBlob();
      if (!blob || blob->getData().size() != bytes ||
          !t.getElementType().isF32())
        return p.emitOpError("initial value blob is missing or has the wrong "
                             "size");
      const char *data = blob->getData().data();
      if (p->hasAttr(kInitialValueTransposedAttr)) {
        if (t.getRank() != 2)
          return p.emitOpError("has a transposed initial value but is not a "
                               "matrix");
        int64_t rows = t.getDimSize(0), cols = t.getDimSize(1);
        // A tensor in a file is read into `scratch` once, when its first
        // rows are asked for (reading the file beats faulting the mapping
        // in page by page, several times over here), and transposed from
        // there; otherwise straight from memory.
        ref.read = [data, rows, cols, bytes, &mappings,
                    &scratch](uint64_t begin, uint64_t count, float *out) {
          if (begin == 0) {
            auto [fd, offset] = mappings.source(data, bytes);
            scratch.resize(bytes);
            if (fd < 0 ||
                !::fastllm::rt::readAt(fd, scratch.data(), bytes, offset))
              scratch.clear();
          }
          const char *from = scratch.size() == bytes ? scratch.data() : data;
          readTransposed(from, rows, cols, begin, count, out);
        };
      } else {
        ref.data = data;
        ref.source = [&mappings, data, bytes]() {
          return mappings.source(data, bytes);
        };
      }
      ref.written = [&mappings, data, bytes]() {
        mappings.release(data, bytes);
      };
    } else if (auto dense = dyn_cast<DenseElementsAttr>(init)) {
      if (!t.getElementType().isF32())
        return p.emitOpError("initial value is not f32");
      ref.read = [dense](uint64_t begin, uint64_t count, float *out) {
        auto it = dense.value_begin<APFloat>() + begin;
        for (uint64_t k = 0; k < count; ++k, ++it)
          out[k] = (*it).convertToFloat();
      };
    } else {
      return p.emitOpError("initial value kind is not supported");
    }
    tensors.push_back(std::move(ref));
  }
  // Not synced before its rename: the file is the model's weights again and
  // compile can make it anew (syncing 3.8 GB cost 1.3-1.9 s of the 0.94B
  // model's compile); after a crash a short file is refused by train.
  // Where a tensor under a generated name is read (tools/fastllm_weights.py
  // tells tensors of equal values apart by it).
  std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"}, {"producer", "fastllm-opt"}};
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto scope = p->getAttrOfType<StringAttr>(model::kModuleScopeAttr))
      metadata.push_back({"fastllm.module." + p.getSymName().str(),
                          scope.getValue().str()});
  ::fastllm::rt::Status status = ::fastllm::rt::writeSafetensors(
      path.str(), tensors, metadata,
      /*written=*/nullptr, /*durable=*/false);
  if (!status.ok()) {
    // write() from a mapping whose file shrank fails with EFAULT (a read in
    // this process raises SIGBUS instead: frontend/ExternalData.cpp).
    if (StringRef(status.message()).ends_with(std::strerror(EFAULT)))
      return module.emitError(status.message())
             << " (a model file mapped in memory, the .onnx or its external "
                "data, was probably truncated while being read)";
    return module.emitError(status.message());
  }
  return success();
}
