// The device queues: one in-order worker thread per device runs the kernels it is given.
//
// What this emulates: a CUDA/NPU stream. The host enqueues and goes on; a copy to the host,
// item(), synchronize() and Event.synchronize() wait. A task's error is kept and raised by the
// next wait on its device, then cleared (CUDA keeps some errors sticky; this device does not).
// Finished tasks are destroyed by the host thread at its next enqueue or wait, never by the
// worker: the last reference to a tensor that Python also knows must drop where the GIL can be
// taken without waiting on the worker.
#include "npu.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace accuracy_npu {
namespace {

std::atomic<bool> g_blocking{false};
std::atomic<bool> g_forked{false};
std::atomic<bool> g_shut{false};
thread_local bool t_in_worker = false;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Task {
  std::function<void()> run;
  std::string what;
  int threads = 0;
  bool kernel = true;
};

struct Queue {
  c10::DeviceIndex index = 0;
  std::mutex mu;
  std::condition_variable work, done;
  std::deque<Task> tasks;
  uint64_t submitted = 0, completed = 0;
  bool paused = false, stopping = false, started = false;
  std::thread worker;
  std::string error;
  std::vector<std::function<void()>> graveyard;
  std::atomic<int64_t> delay_us{0};

  void loop() {
    t_in_worker = true;
    int threads = 0;
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu);
        work.wait(lock, [&] { return stopping || (!paused && !tasks.empty()); });
        if (tasks.empty()) return;  // stopping, and nothing left to run
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      if (int64_t d = delay_us.load()) std::this_thread::sleep_for(std::chrono::microseconds(d));
      if (task.threads > 0 && task.threads != threads) {
        at::set_num_threads(task.threads);  // the host's setting, so reductions split the same
        threads = task.threads;
      }
      std::string failure;
      try {
        task.run();
      } catch (const c10::Error& e) {
        failure = e.what_without_backtrace();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure.empty()) {
          counters().kernels_failed++;
          if (error.empty()) error = task.what + ": " + failure;
        }
        graveyard.push_back(std::move(task.run));
        completed++;
      }
      done.notify_all();
    }
  }

  // Under `lock`: hand the finished tasks to the caller, who destroys them unlocked.
  std::vector<std::function<void()>> take_graveyard() {
    std::vector<std::function<void()>> out;
    out.swap(graveyard);
    return out;
  }
};

Queue* queues() {
  static Queue* all = [] {
    auto* q = new Queue[kDeviceCount];  // never freed: see shutdown()
    for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) q[i].index = i;
    pthread_atfork(nullptr, nullptr, [] { g_forked = true; });
    if (const char* env = std::getenv("ASCEND_LAUNCH_BLOCKING")) g_blocking = env[0] == '1';
    return q;
  }();
  return all;
}

std::mutex reasons_mu;
std::map<std::string, int64_t> reasons;

void count_sync(const std::string& reason, bool explicit_sync) {
  (explicit_sync ? counters().syncs_explicit : counters().syncs_implicit)++;
  std::lock_guard<std::mutex> lock(reasons_mu);
  reasons[reason]++;
}

// Wait (lock held) until the queue reached `seq`; returns the pending error, cleared.
std::string wait_until(Queue& q, std::unique_lock<std::mutex>& lock, uint64_t seq) {
  TORCH_CHECK(!(q.paused && q.completed < seq), "npu:", int(q.index),
              " is paused by a test hook and has queued work: resume it before waiting");
  q.done.wait(lock, [&] { return q.completed >= seq; });
  std::string err;
  err.swap(q.error);
  return err;
}

[[noreturn]] void raise_async(const std::string& err, c10::DeviceIndex index) {
  TORCH_CHECK(false, "npu:", int(index), ": a kernel queued earlier failed: ", err,
              " (errors of queued kernels are raised at the next synchronisation, like CUDA's; "
              "ASCEND_LAUNCH_BLOCKING=1 raises them at the call)");
}

}  // namespace

Counters& counters() {
  static auto* c = new Counters();
  return *c;
}

bool in_bad_fork() {
  return g_forked.load();
}

void check_not_forked() {
  TORCH_CHECK(!g_forked.load(),
              "npu test device: cannot be used in a forked child process (its queues live in "
              "the parent, as with CUDA); use the 'spawn' start method");
}

void enqueue(c10::DeviceIndex index, std::string what, std::function<void()> run) {
  check_not_forked();
  Queue& q = queues()[check_index(index)];
  bool kernel = what.rfind("event", 0) != 0;  // markers and waits are not kernels
  if (kernel) counters().kernels_queued++;
  if (g_shut.load()) {  // after interpreter exit began: run here, in order (the queue is empty)
    run();
    return;
  }
  std::vector<std::function<void()>> dead;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (!q.started) {
      q.started = true;
      q.worker = std::thread([&q] { q.loop(); });
    }
    q.tasks.push_back(Task{std::move(run), std::move(what), at::get_num_threads(), kernel});
    seq = ++q.submitted;
    dead = q.take_graveyard();
  }
  q.work.notify_one();
  dead.clear();
  if (g_blocking.load() && !t_in_worker) {
    std::string err;
    {
      std::unique_lock<std::mutex> lock(q.mu);
      err = wait_until(q, lock, seq);
      dead = q.take_graveyard();
    }
    dead.clear();
    if (!err.empty()) raise_async(err, index);
  }
}

void drain(c10::DeviceIndex index, const std::string& reason, bool explicit_sync) {
  check_not_forked();
  Queue& q = queues()[check_index(index)];
  count_sync(reason, explicit_sync);
  if (t_in_worker) return;  // a kernel asking: everything before it already ran
  std::string err;
  std::vector<std::function<void()>> dead;
  {
    std::unique_lock<std::mutex> lock(q.mu);
    err = wait_until(q, lock, q.submitted);
    dead = q.take_graveyard();
  }
  dead.clear();
  if (!err.empty()) raise_async(err, q.index);
}

void drain_all(const std::string& reason) {
  for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) drain(i, reason);
}

bool queue_idle(c10::DeviceIndex index) {
  Queue& q = queues()[check_index(index)];
  std::lock_guard<std::mutex> lock(q.mu);
  return q.completed == q.submitted;
}

std::shared_ptr<EventState> record_marker(c10::DeviceIndex index) {
  auto state = std::make_shared<EventState>();
  state->device = check_index(index);
  std::weak_ptr<EventState> weak = state;
  enqueue(state->device, "event", [weak] {
    if (auto s = weak.lock()) {
      s->when_ns = now_ns();
      s->done = true;
    }
  });
  return state;
}

void wait_marker(const std::shared_ptr<EventState>& state, const std::string& reason) {
  check_not_forked();
  count_sync(reason, true);
  if (t_in_worker || state->done.load()) {
    Queue& q = queues()[state->device];
    std::string err;
    {
      std::lock_guard<std::mutex> lock(q.mu);
      err.swap(q.error);
    }
    if (!err.empty()) raise_async(err, state->device);
    return;
  }
  Queue& q = queues()[state->device];
  std::string err;
  std::vector<std::function<void()>> dead;
  {
    std::unique_lock<std::mutex> lock(q.mu);
    TORCH_CHECK(!q.paused, "npu:", int(q.index),
                " is paused by a test hook: resume it before waiting on an event");
    q.done.wait(lock, [&] { return state->done.load(); });
    err.swap(q.error);
    dead = q.take_graveyard();
  }
  dead.clear();
  if (!err.empty()) raise_async(err, state->device);
}

void set_blocking(bool on) {
  queues();
  g_blocking = on;
}

bool blocking() {
  queues();
  return g_blocking.load();
}

void set_paused(c10::DeviceIndex index, bool paused) {
  Queue& q = queues()[check_index(index)];
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.paused = paused;
  }
  q.work.notify_all();
}

void set_delay_us(c10::DeviceIndex index, int64_t micros) {
  queues()[check_index(index)].delay_us = micros;
}

void shutdown() {
  if (g_forked.load() || g_shut.exchange(true)) return;
  Queue* all = queues();
  for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) {
    Queue& q = all[i];
    std::vector<std::function<void()>> dead;
    {
      std::unique_lock<std::mutex> lock(q.mu);
      if (!q.started) continue;
      q.paused = false;
      q.stopping = true;
    }
    q.work.notify_all();
    q.worker.join();
    {
      std::lock_guard<std::mutex> lock(q.mu);
      dead = q.take_graveyard();
    }
  }
}

std::map<std::string, int64_t> sync_reasons() {
  std::lock_guard<std::mutex> lock(reasons_mu);
  return reasons;
}

void reset_counters() {
  Counters& c = counters();
  for (auto* a : {&c.d2h_copies, &c.d2h_bytes, &c.d2h_nonblocking, &c.h2d_copies, &c.h2d_bytes,
                  &c.h2d_nonblocking, &c.d2d_copies, &c.d2d_bytes, &c.syncs_explicit,
                  &c.syncs_implicit, &c.kernels_queued, &c.kernels_sync, &c.kernels_failed})
    a->store(0);
  std::lock_guard<std::mutex> lock(reasons_mu);
  reasons.clear();
}

}  // namespace accuracy_npu
