//===- OnnxImporter.cpp - ONNX ModelProto to the model dialect ------------===//
//
// The entry points: a model file or buffer is parsed (binary protobuf or the
// ONNX text format) and handed to a GraphImporter (GraphImporter.h), whose
// steps live in the frontend's other files.
//
//===----------------------------------------------------------------------===//

#include "frontend/OnnxImporter.h"
#include "frontend/GraphImporter.h"
#include "frontend/OnnxLibrary.h"
#include "ir/ModelDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <google/protobuf/io/zero_copy_stream_impl.h>

#include <climits>
#include <unistd.h>

using namespace mlir;
using namespace mlir::fastllm;

void mlir::fastllm::registerOnnxImportDialects(DialectRegistry &registry) {
  registry.insert<model::ModelDialect, func::FuncDialect>();
}

static OwningOpRef<ModuleOp>
importModel(MLIRContext *context, onnx::ModelProto &model, StringRef name,
            StringRef modelDir, const OnnxImportOptions &options,
            std::shared_ptr<MappedFile> file = nullptr,
            std::vector<std::optional<ArrayRef<char>>> rawData = {}) {
  context->loadDialect<model::ModelDialect, func::FuncDialect>();
  GraphImporter importer(context, name, modelDir, options);
  if (file)
    importer.setMappedRawData(std::move(file), std::move(rawData));
  return importer.run(model);
}

static OwningOpRef<ModuleOp> parseText(MLIRContext *context, StringRef text,
                                       StringRef name, StringRef modelDir,
                                       const OnnxImportOptions &options) {
  onnx::ModelProto model;
  std::string error = parseOnnxText(text.str(), model);
  if (!error.empty())
    return mlir::emitError(FileLineColLoc::get(context, name, 0, 0))
               << "cannot parse ONNX text: " << error,
           nullptr;
  return importModel(context, model, name, modelDir, options);
}

OwningOpRef<ModuleOp>
mlir::fastllm::importOnnxBuffer(MLIRContext *context, StringRef buffer,
                                StringRef name, StringRef modelDir,
                                const OnnxImportOptions &options) {
  Location loc = FileLineColLoc::get(context, name, 0, 0);
  if (buffer.empty())
    return mlir::emitError(loc) << "the file is empty", nullptr;
  if (options.textFormat)
    return parseText(context, buffer, name, modelDir, options);
  onnx::ModelProto model;
  if (buffer.size() > INT_MAX ||
      !model.ParseFromArray(buffer.data(), (int)buffer.size()))
    return mlir::emitError(loc)
               << "not a valid ONNX model (protobuf parsing failed; the file "
                  "may be truncated)",
           nullptr;
  return importModel(context, model, name, modelDir, options);
}

OwningOpRef<ModuleOp> mlir::fastllm::importOnnxFile(MLIRContext *context,
                                                    StringRef path,
                                                    OnnxImportOptions options) {
  Location loc = FileLineColLoc::get(context, path, 0, 0);
  if (path.ends_with(".onnxtext"))
    options.textFormat = true;
  SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";

  uint64_t size = 0;
  std::string openError;
  int fd = openRegularFile(path.str(), size, openError);
  if (fd < 0)
    return mlir::emitError(loc) << openError, nullptr;
  if (size == 0) {
    ::close(fd);
    return mlir::emitError(loc) << "the file is empty", nullptr;
  }
  if (options.textFormat) {
    auto buffer =
        llvm::MemoryBuffer::getOpenFile(fd, path, size,
                                        /*RequiresNullTerminator=*/true);
    ::close(fd);
    if (!buffer)
      return mlir::emitError(loc)
                 << "cannot read the file: " << buffer.getError().message(),
             nullptr;
    return importOnnxBuffer(context, (*buffer)->getBuffer(), path, dir,
                            options);
  }

  // A binary model is parsed from a read-only mapping of the file, its
  // large initializers left there (MappedModel.cpp); failing that, from a
  // file stream, so the file's bytes are not held in memory next to the
  // parsed weights.
  onnx::ModelProto model;
  if (std::shared_ptr<MappedFile> file = mapFileReadOnly(fd, size)) {
    std::vector<std::optional<ArrayRef<char>>> rawData;
    if (parseMappedModel(file->base, file->size, model, rawData)) {
      ::close(fd);
      return importModel(context, model, path, dir, options, std::move(file),
                         std::move(rawData));
    }
    model.Clear();
  }
  bool parsed;
  {
    google::protobuf::io::FileInputStream stream(fd);
    parsed = model.ParseFromZeroCopyStream(&stream) && stream.GetErrno() == 0;
  }
  ::close(fd);
  if (!parsed)
    return mlir::emitError(loc)
               << "not a valid ONNX model (protobuf parsing failed; the file "
                  "may be truncated)",
           nullptr;
  return importModel(context, model, path, dir, options);
}
