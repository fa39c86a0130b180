#include "services/base/shutdown_signal.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>

#include "common/log/log.h"

namespace pd::services {

ShutdownSignal::ShutdownSignal() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  // SIGUSR1 is ours: the destructor uses it to wake the watcher.
  sigaddset(&set_, SIGUSR1);
  CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set_, nullptr), 0);
  watcher_ = std::thread([this] { WatchLoop(); });
}

ShutdownSignal::~ShutdownSignal() {
  pthread_kill(watcher_.native_handle(), SIGUSR1);
  watcher_.join();
}

void ShutdownSignal::Wait() { notified_.WaitForNotification(); }

void ShutdownSignal::Trigger() { Fire(0); }

void ShutdownSignal::Fire(int sig) {
  if (!fired_.exchange(true)) {
    signal_number_ = sig;
    notified_.Notify();
  }
}

void ShutdownSignal::WatchLoop() {
  while (true) {
    int sig = 0;
    if (sigwait(&set_, &sig) != 0) {
      continue;
    }
    if (sig == SIGUSR1) {
      return;
    }
    if (fired_.load()) {
      LOG(WARNING) << "second signal " << sig << " during drain: exiting now";
      std::_Exit(130);
    }
    LOG(INFO) << "signal " << sig << " received: draining";
    Fire(sig);
  }
}

}  // namespace pd::services
