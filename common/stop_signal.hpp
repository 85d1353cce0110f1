// StopSignal: turns SIGINT and SIGTERM into a flag that a serving loop polls.
//
// Signals are taken by a Boost.Asio signal_set on a thread of its own, so nothing runs inside
// an async-signal handler. Create one per process, before starting other threads.
#pragma once

#include <atomic>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

namespace parasol {

class StopSignal {
 public:
  StopSignal();
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  const std::atomic<bool>& flag() const { return stop_; }
  // The signal that set the flag, or 0.
  int signal() const { return signal_.load(); }

 private:
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  std::atomic<bool> stop_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;
};

}  // namespace parasol
