#include "common/stop_signal.hpp"

#include <csignal>

namespace parasol {

StopSignal::StopSignal() : signals_(io_, SIGINT, SIGTERM) {
  signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    signal_.store(signal);
    stop_.store(true);
  });
  thread_ = std::thread([this] { io_.run(); });
}

StopSignal::~StopSignal() {
  io_.stop();
  thread_.join();
}

}  // namespace parasol
