// Devices, streams, events and generators: what PyTorch asks of a backend through its guard
// (c10::impl::DeviceGuardImplInterface) and hooks (at::PrivateUse1HooksInterface).
//
// Streams: every stream of a device maps to its one in-order queue, so waiting between
// streams of one device is free and ordering is always kept (no real concurrency to test).
#include "npu.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace accuracy_npu {
namespace {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;
thread_local c10::DeviceIndex t_device = 0;
thread_local c10::StreamId t_stream[kDeviceCount] = {};
std::atomic<c10::StreamId> g_next_stream{1};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct NpuGenerator final : c10::GeneratorImpl {
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;

  explicit NpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kNpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  static c10::DeviceType device_type() {
    return kNpu;
  }
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    uint64_t words[2] = {seed_, offset_};
    std::memcpy(state.data_ptr(), words, sizeof(words));
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 16 &&
                    state.device().is_cpu() && state.is_contiguous(),
                "an npu RNG state is a contiguous CPU torch.uint8 tensor of 16 bytes (what "
                "torch.npu.get_rng_state() returns), got ", state.numel(), " elements of ",
                state.dtype());
    uint64_t words[2];
    std::memcpy(words, state.data(), sizeof(words));
    seed_ = words[0];
    offset_ = words[1];
  }
  NpuGenerator* clone_impl() const override {
    auto* g = new NpuGenerator(device_.index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  // The seed of one kernel's CPU generator; the caller holds mutex_.
  uint64_t next_kernel_seed() {
    return splitmix64(seed_ ^ splitmix64(offset_++));
  }
};

struct NpuEvent {
  std::shared_ptr<EventState> state;
};

NpuEvent* as_event(void* e) {
  return static_cast<NpuEvent*>(e);
}

c10::DeviceIndex index_of(c10::Device d) {
  TORCH_CHECK(d.type() == kNpu, "expected an npu device, got ", d);
  return check_index(d.index());
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return {kNpu, t_device};
  }
  void setDevice(c10::Device d) const override {
    t_device = index_of(d);
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kDeviceCount) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    c10::DeviceIndex i = index_of(d);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, i), t_stream[i]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNpu, index_of(d)));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, index_of(d)), g_next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    t_stream[index_of(s.device())] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return in_bad_fork() ? 0 : kDeviceCount;
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", int(device_index),
                " does not match recording stream's device index ", int(stream.device_index()));
    auto* e = as_event(*event);
    if (e == nullptr) {
      e = new NpuEvent();
      *event = e;
    }
    e->state = record_marker(stream.device_index());
  }
  void block(void* event, const c10::Stream& stream) const override {
    auto* e = as_event(event);
    if (e == nullptr || !e->state || e->state->device == stream.device_index()) return;
    std::shared_ptr<EventState> state = e->state;  // another device: wait for it in order
    enqueue(stream.device_index(), "event wait", [state] {
      while (!state->done.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
  }
  bool queryEvent(void* event) const override {
    auto* e = as_event(event);
    return e == nullptr || !e->state || e->state->done.load();
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete as_event(event);
  }
  bool queryStream(const c10::Stream& stream) const override {
    return queue_idle(stream.device_index());
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    drain(stream.device_index(), "Stream.synchronize", true);
  }
  void synchronizeEvent(void* event) const override {
    auto* e = as_event(event);
    if (e != nullptr && e->state) wait_marker(e->state, "Event.synchronize");
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    drain(check_index(device_index), "torch.npu.synchronize", true);
  }
  double elapsedTime(void* event1, void* event2, const c10::DeviceIndex /*device_index*/) const override {
    auto *a = as_event(event1), *b = as_event(event2);
    TORCH_CHECK(a && b && a->state && b->state,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->state->done.load() && b->state->done.load(),
                "Both events must be completed before calculating elapsed time.");
    return double(b->state->when_ns - a->state->when_ns) / 1e6;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return !in_bad_fork();
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    c10::DeviceIndex i = device_of(data);
    TORCH_CHECK(i >= 0, "npu test device: ", data, " is not an npu address");
    return {kNpu, i};
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_allocator();
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }
  void init() const override {}
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_bytes(storage, newsize);
  }
  c10::DeviceIndex deviceCount() const override {
    return in_bad_fork() ? 0 : kDeviceCount;
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
};

std::vector<at::Generator>& default_generators() {
  static auto* all = [] {
    auto* g = new std::vector<at::Generator>();
    for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i)
      g->push_back(at::make_generator<NpuGenerator>(i));
    return g;
  }();
  return *all;
}

}  // namespace

c10::DeviceIndex current_device() {
  return t_device;
}

void set_current_device(c10::DeviceIndex index) {
  t_device = check_index(index);
}

c10::DeviceIndex check_index(c10::DeviceIndex index) {
  if (index == -1) return t_device;
  TORCH_CHECK(index >= 0 && index < kDeviceCount, "npu:", int(index),
              " does not exist: the npu test device has ", int(kDeviceCount), " devices");
  return index;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  return default_generators()[check_index(index)];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<NpuGenerator>(check_index(index));
}

at::Generator kernel_generator(const std::optional<at::Generator>& gen, c10::DeviceIndex index) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : default_generator(index);
  TORCH_CHECK(g.device().type() == kNpu, "Expected a 'npu' device type for generator but found '",
              g.device().type(), "'");
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    seed = g.get<NpuGenerator>()->next_kernel_seed();
  }
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

bool register_hooks() {
  static bool ours = [] {
    if (at::isPrivateUse1HooksRegistered()) return false;
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    c10::SetAllocator(c10::DeviceType::PrivateUse1, current_device_allocator());
    return true;
  }();
  return ours;
}

}  // namespace accuracy_npu
