#pragma once
// ConnectionPool: the httplib::TaskQueue that runs connections. Each
// connection holds a thread for its whole life (a streaming response can last
// minutes), so a fixed pool of a few threads would queue the 9th client behind
// the first 8. This pool grows a thread whenever none is idle, up to
// `max_threads`; past that, connections wait for a free thread.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace serval::server {

class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads);
  ~ConnectionPool() override;

  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then joins every thread.
  void shutdown() override;

 private:
  void work();

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace serval::server
