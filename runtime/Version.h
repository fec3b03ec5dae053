//===- Version.h - the project's version and commit -------------*- C++ -*-===//
//
// What `fastllm-opt --version`, plan.json, the training binary's first line
// and every checkpoint manifest record: the version in the repository's
// VERSION file and the commit the build came from.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_VERSION_H
#define FASTLLM_RUNTIME_VERSION_H

namespace fastllm::rt {

/// The project's version, e.g. "0.1.0".
const char *projectVersion();
/// The commit the build came from (`git describe`, "-dirty" for a tree with
/// changes), or "unknown".
const char *buildCommit();
/// "<version> (commit <commit>)".
const char *versionString();

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_VERSION_H
