//===- Signals.h - stopping a training run on request -----------*- C++ -*-===//
//
// SIGTERM, SIGINT and SIGUSR1 ask a run to stop, and so do SIGHUP (the
// terminal closed) and SIGPIPE (the reader of its log went away, as with
// `train ... | head`), which would otherwise end it without a checkpoint:
// the handler only records
// the signal (async-signal-safe), and the training loop, which exchanges the
// record among ranks with each step's gradient-norm all-reduce, finishes the
// step on every rank, writes a checkpoint when --checkpoint-dir is set and
// returns; main() then exits with 128 + the signal's number. A second
// signal of the same kind ends the process at once (the default action).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_SIGNALS_H
#define FASTLLM_RUNTIME_SIGNALS_H

namespace fastllm::rt {

/// Installs the handlers for SIGTERM, SIGINT, SIGUSR1, SIGHUP and SIGPIPE
/// (main() does; a
/// library caller such as a test may not want them).
void installStopHandlers();

/// The first stop signal received since the last clearStopRequest(), or 0.
int stopRequest();

/// Until called with true (the training loop, when its first step starts),
/// a stop signal ends the process at once with 128 + the signal: nothing
/// is saved before a step has run, and loading may be stuck in a library.
void setStopWaitsForStep(bool waits);

/// A stop requested after that waits at most `seconds` (0: no limit) for
/// its step and checkpoint; then SIGALRM ends the process (a step stuck in
/// a library must not keep a scheduler's SIGTERM from acting).
void setStopDeadline(double seconds);

/// Records `signal` as if it had been received (tests), or clears it.
void requestStop(int signal);
void clearStopRequest();

/// "SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", "SIGPIPE", or "signal N".
const char *stopSignalName(int signal);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_SIGNALS_H
