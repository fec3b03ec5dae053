//===- Signals.cpp - stopping a training run on request -------------------===//

#include "runtime/Signals.h"

#include <csignal>
#include <cstdio>
#include <initializer_list>
#include <unistd.h>

using namespace fastllm::rt;

namespace {

volatile std::sig_atomic_t received = 0;
volatile std::sig_atomic_t atOnce = 1;
/// Seconds a requested stop may take before SIGALRM ends the process; 0:
/// no limit.
volatile std::sig_atomic_t deadlineSeconds = 0;

extern "C" void onStopSignal(int signal) {
  // Before the first step there is nothing to save, and the process may be
  // stuck in a library (OpenBLAS retrying an allocation under a memory
  // limit spun for minutes): end it now. SIGPIPE alone waits (the log's
  // reader went away; the loading needs no reader).
  if (atOnce && signal != SIGPIPE)
    _exit(128 + signal);
  if (!received) {
    received = signal;
    // A step that never ends (a library stuck retrying an allocation)
    // would keep the stop from happening: past the deadline, SIGALRM's
    // default action ends the process.
    if (deadlineSeconds > 0)
      alarm(unsigned(deadlineSeconds));
  }
}

} // namespace

void fastllm::rt::installStopHandlers() {
  for (int signal : {SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGPIPE}) {
    struct sigaction action = {};
    action.sa_handler = onStopSignal;
    sigemptyset(&action.sa_mask);
    // SA_RESETHAND: the second signal of a kind takes the default action
    // (ends the process), for a user who does not want to wait for the step.
    // Not for SIGPIPE: once the reader of the log is gone, every later line
    // raises it again, and the run must still reach its checkpoint (the
    // writes fail with EPIPE instead). SA_RESTART: reads, writes and waits
    // carry on after the handler.
    action.sa_flags = SA_RESTART | (signal == SIGPIPE ? 0 : SA_RESETHAND);
    sigaction(signal, &action, nullptr);
  }
}

int fastllm::rt::stopRequest() { return received; }

void fastllm::rt::setStopWaitsForStep(bool waits) { atOnce = !waits; }

void fastllm::rt::setStopDeadline(double seconds) {
  deadlineSeconds = seconds <= 0 ? 0
                    : seconds > 86400 ? 86400
                                      : std::sig_atomic_t(seconds + 0.5);
}

void fastllm::rt::requestStop(int signal) { received = signal; }

void fastllm::rt::clearStopRequest() { received = 0; }

const char *fastllm::rt::stopSignalName(int signal) {
  switch (signal) {
  case SIGTERM:
    return "SIGTERM";
  case SIGINT:
    return "SIGINT";
  case SIGUSR1:
    return "SIGUSR1";
  case SIGHUP:
    return "SIGHUP";
  case SIGPIPE:
    return "SIGPIPE";
  }
  static char buf[32];
  std::snprintf(buf, sizeof(buf), "signal %d", signal);
  return buf;
}
