//===- WholeNumberFlag.h - integer flags with plain-words errors -*- C++ -*-===//
//
// LLVM's integer flags show as `--dp=<long>` and refuse `--dp 1e3` with
// "value invalid for long argument!", and read `010` as octal and `0x10`
// as hex. The parser here takes decimal digits only (as `train` does: `010`
// is ten), says what it wanted otherwise, and shows as `--dp=<N>`. Each
// flag's own range is checked where it is used.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_TOOLS_WHOLENUMBERFLAG_H
#define FASTLLM_TOOLS_WHOLENUMBERFLAG_H

#include "llvm/Support/CommandLine.h"

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace mlir::fastllm {

/// LLVM's parser for `long long` or `unsigned long long` with another
/// message and value name.
template <typename T>
class WholeNumberParser : public llvm::cl::parser<T> {
public:
  using llvm::cl::parser<T>::parser;

  bool parse(llvm::cl::Option &option, llvm::StringRef name,
             llvm::StringRef arg, T &value) {
    if (!arg.getAsInteger(10, value))
      return false;
    std::string shown = arg.size() > 40 ? arg.take_front(40).str() + "..."
                                        : arg.str();
    llvm::StringRef digits = arg;
    bool negative = digits.consume_front("-");
    bool allDigits = !digits.empty() &&
                     digits.find_first_not_of("0123456789") ==
                         llvm::StringRef::npos;
    if (allDigits && negative && std::is_unsigned_v<T>)
      return option.error("'" + shown + "' is negative: give 0 or more");
    if (allDigits)
      return option.error("'" + shown + "' is out of range (" +
                          std::to_string(std::numeric_limits<T>::min()) +
                          " to " +
                          std::to_string(std::numeric_limits<T>::max()) +
                          ")");
    return option.error("'" + shown +
                        "' is not a whole number (digits, like 1024)");
  }
  llvm::StringRef getValueName() const override { return "N"; }
};

/// cl::opt<T> for any T, with WholeNumberParser for 64-bit integers.
template <typename T, typename = void> struct FlagType {
  using type = llvm::cl::opt<T>;
};
template <typename T>
struct FlagType<T, std::enable_if_t<std::is_integral_v<T> &&
                                    !std::is_same_v<T, bool> &&
                                    sizeof(T) == 8>> {
  using Wide = std::conditional_t<std::is_signed_v<T>, long long,
                                  unsigned long long>;
  using type = llvm::cl::opt<Wide, false, WholeNumberParser<Wide>>;
};
template <typename T> using Flag = typename FlagType<T>::type;

} // namespace mlir::fastllm

#endif // FASTLLM_TOOLS_WHOLENUMBERFLAG_H
