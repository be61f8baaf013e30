// The npu test device: shared declarations of its parts (memory, queue, RNG, counters).
//
// A PrivateUse1 device whose memory the host cannot address, whose kernels (PyTorch's CPU
// kernels) run in order on one worker thread per device, and whose random ops draw from its own
// generators. See docs/testdevice.md for what it emulates and what it does not.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/GeneratorImpl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace accuracy_npu {

constexpr c10::DeviceIndex kDeviceCount = 2;

// ---- memory (memory.cpp) ----------------------------------------------------------------
// Device addresses lie in a reserved PROT_NONE range: the host faults on them. The bytes live
// in a second mapping of the same size; only the device's own kernels and copies translate.
void* real_address(const void* device_address);  // nullptr stays nullptr; throws if foreign
c10::Allocator* device_allocator(c10::DeviceIndex index);
c10::Allocator* current_device_allocator();  // registered as PrivateUse1's allocator
c10::Allocator* pinned_allocator();
bool is_pinned(const void* host_address);
c10::DeviceIndex device_of(const void* device_address);  // -1 when not a device address
struct MemoryStats {
  int64_t allocated = 0;  // bytes held by live tensors (rounded blocks)
  int64_t peak = 0;
  int64_t reserved = 0;  // bytes of the range ever handed out (its high-water mark)
  int64_t total = 0;     // size of the device's range
};
MemoryStats memory_stats(c10::DeviceIndex index);
void reset_peak(c10::DeviceIndex index);
int64_t pinned_bytes();

// ---- the device queues (queue.cpp) -----------------------------------------------------------
// One in-order queue and worker thread per device. `enqueue` returns at once; the task runs
// later on the worker. Errors raised by a task are kept and raised at the next wait on that
// device (like CUDA's asynchronous errors); ASCEND_LAUNCH_BLOCKING=1 waits after every task.
void enqueue(c10::DeviceIndex index, std::string what, std::function<void()> task);
// Wait until every task queued on the device ran, then raise the first error a task raised
// since the last wait. `reason` is counted in sync_reasons(); `explicit_sync` tells a call the
// user made (synchronize(), Event.synchronize()) from one an op needed (item(), a blocking copy).
void drain(c10::DeviceIndex index, const std::string& reason, bool explicit_sync = false);
void drain_all(const std::string& reason);
bool queue_idle(c10::DeviceIndex index);
// Events: a marker in the queue; `done` flips when the worker reaches it.
struct EventState {
  std::atomic<bool> done{false};
  int64_t when_ns = 0;
  c10::DeviceIndex device = 0;
};
std::shared_ptr<EventState> record_marker(c10::DeviceIndex index);
void wait_marker(const std::shared_ptr<EventState>& state, const std::string& reason);
void set_blocking(bool on);
bool blocking();
void shutdown();  // drain and stop the workers (at interpreter exit)
bool in_bad_fork();
void check_not_forked();
// Test hooks: a paused queue keeps its tasks; a delay makes every task slower.
void set_paused(c10::DeviceIndex index, bool paused);
void set_delay_us(c10::DeviceIndex index, int64_t micros);

// ---- counters (queue.cpp) ----------------------------------------------------------------
struct Counters {
  std::atomic<int64_t> d2h_copies{0}, d2h_bytes{0}, d2h_nonblocking{0};
  std::atomic<int64_t> h2d_copies{0}, h2d_bytes{0}, h2d_nonblocking{0};
  std::atomic<int64_t> d2d_copies{0}, d2d_bytes{0};
  std::atomic<int64_t> syncs_explicit{0}, syncs_implicit{0};
  std::atomic<int64_t> kernels_queued{0}, kernels_sync{0}, kernels_failed{0};
};
Counters& counters();
std::map<std::string, int64_t> sync_reasons();
void reset_counters();

// ---- RNG (device.cpp) --------------------------------------------------------------------
// A (seed, offset) generator like CUDA's Philox: each random kernel takes the next offset and
// runs with a CPU generator seeded from the pair, so results do not depend on when it runs.
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
at::Generator kernel_generator(const std::optional<at::Generator>& gen, c10::DeviceIndex index);

// ---- device selection (device.cpp) -------------------------------------------------------------
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
c10::DeviceIndex check_index(c10::DeviceIndex index);  // -1 means the current device

// ---- kernels (kernels.cpp) -----------------------------------------------------------------
// A CPU tensor over the device memory of `t` (same storage offset, sizes, strides): what the
// device's own kernels compute on. Never hand one to user code: it is valid only while `t`'s
// storage lives and must be used in queue order.
// The alias owns a reference to the device storage, so it keeps the memory alive.
at::Tensor host_alias(const at::Tensor& t);
// Grow or shrink a device storage; the old bytes are copied (and freed) in queue order.
void resize_bytes(const c10::Storage& storage, size_t nbytes);
bool register_hooks();  // the PrivateUse1 hooks interface; false if another backend's are there

}  // namespace accuracy_npu
