// Turns SIGTERM / SIGINT into a notification a main loop can wait on, so servers drain instead
// of dying mid-request.
#pragma once

#include <atomic>
#include <csignal>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace pd::services {

// Blocks SIGTERM and SIGINT in the calling thread (call it in main before starting any other
// thread, so every thread inherits the mask) and watches them on a dedicated thread with
// sigwait. The first signal notifies; a second one exits the process at once (exit code 130),
// the operator's escape hatch when a drain hangs. Thread-safe after construction.
class ShutdownSignal {
 public:
  ShutdownSignal();
  ~ShutdownSignal();
  ShutdownSignal(const ShutdownSignal&) = delete;
  ShutdownSignal& operator=(const ShutdownSignal&) = delete;

  // Blocks until a signal arrives or Trigger() is called.
  void Wait();
  // True once a signal arrived or Trigger() was called.
  bool triggered() const { return notified_.HasBeenNotified(); }
  // Requests shutdown as if a signal had arrived (tests, fatal errors).
  void Trigger();
  // The signal number that triggered shutdown; 0 when triggered by Trigger().
  int signal_number() const { return signal_number_; }

 private:
  void WatchLoop();
  // Notifies once, whichever of a signal or Trigger() comes first.
  void Fire(int sig);

  sigset_t set_;
  absl::Notification notified_;
  std::atomic<bool> fired_{false};
  std::atomic<int> signal_number_{0};
  std::thread watcher_;
};

}  // namespace pd::services
