#include "services/base/shutdown_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/log/log.h"

namespace pd::services {
namespace {

// Write end of the active instance's pipe, for the async-signal-safe handler.
std::atomic<int> g_signal_fd{-1};

void OnSignal(int sig) {
  const int saved = errno;
  const int fd = g_signal_fd.load();
  if (fd >= 0) {
    const unsigned char b = static_cast<unsigned char>(sig);
    (void)!::write(fd, &b, 1);
  }
  errno = saved;
}

}  // namespace

ShutdownSignal::ShutdownSignal() {
  CHECK_EQ(::pipe2(pipe_, O_CLOEXEC), 0);
  g_signal_fd.store(pipe_[1]);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  CHECK_EQ(::sigaction(SIGTERM, &sa, nullptr), 0);
  CHECK_EQ(::sigaction(SIGINT, &sa, nullptr), 0);
  watcher_ = std::thread([this] { WatchLoop(); });
}

ShutdownSignal::~ShutdownSignal() {
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  g_signal_fd.store(-1);
  const unsigned char stop = 0;  // not a signal number: tells the watcher to return
  (void)!::write(pipe_[1], &stop, 1);
  watcher_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
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
    unsigned char b = 0;
    const ssize_t n = ::read(pipe_[0], &b, 1);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n != 1 || b == 0) {
      return;
    }
    const int sig = b;
    if (fired_.load()) {
      LOG(WARNING) << "second signal " << sig << " during drain: exiting now";
      std::_Exit(130);
    }
    LOG(INFO) << "signal " << sig << " received: draining";
    Fire(sig);
  }
}

}  // namespace pd::services
