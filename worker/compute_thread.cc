#include "worker/compute_thread.h"

#include "common/status.h"
#include "kernels/threads.h"

namespace headway {

ComputeThread::ComputeThread(int num_threads)
    : thread_([this, num_threads] { Run(num_threads); }) {}

ComputeThread::~ComputeThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  task_cv_.notify_all();
  thread_.join();  // a task in progress finishes first
}

void ComputeThread::Start(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    HW_CHECK(!started_);
    task_ = std::move(task);
    started_ = true;
    done_ = false;
  }
  task_cv_.notify_all();
}

bool ComputeThread::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

bool ComputeThread::Wait(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) return false;
  if (timeout) {
    done_cv_.wait_for(lock, *timeout, [this] { return done_; });
  } else {
    done_cv_.wait(lock, [this] { return done_; });
  }
  if (!done_) return false;
  started_ = false;
  return true;
}

void ComputeThread::Run(int num_threads) {
  // The pool is per thread: make it here.
  if (num_threads > 0) cpu::SetNumThreads(num_threads);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    task_cv_.wait(lock, [this] { return quit_ || task_ != nullptr; });
    if (task_ == nullptr) return;  // quit, nothing left to run
    std::function<void()> task = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    task();
    lock.lock();
    done_ = true;
    done_cv_.notify_all();
  }
}

}  // namespace headway
