// Turns SIGTERM / SIGINT into a notification a main loop can wait on, so servers drain instead
// of dying mid-request.
#pragma once

#include <atomic>
#include <csignal>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace pd::services {

// Installs SIGTERM and SIGINT handlers that forward the signal through a self-pipe to a
// dedicated watcher thread. (A handler, not a blocked mask: threads that libraries start
// before main — OpenBLAS does — do not inherit a mask, and a signal delivered to one of them
// would kill the process.) The first signal notifies; a second one exits the process at once
// (exit code 130), the operator's escape hatch when a drain hangs. One instance per process;
// thread-safe after construction. The destructor restores the default actions.
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

  int pipe_[2] = {-1, -1};  // read end, write end (the handler writes one byte per signal)
  absl::Notification notified_;
  std::atomic<bool> fired_{false};
  std::atomic<int> signal_number_{0};
  std::thread watcher_;
};

}  // namespace pd::services
