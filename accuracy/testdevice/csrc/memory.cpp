// Device memory the host cannot address, and pinned host memory.
//
// Each device reserves a PROT_NONE range (its addresses, what data_ptr() returns) and a
// read-write range of the same size (where the bytes are): real = address - fake + real_base.
// Both are MAP_NORESERVE, so only touched pages cost memory. Blocks are carved best-fit from
// the range and coalesced when freed; the pages of large freed blocks go back to the system.
#include "npu.h"

#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

namespace accuracy_npu {
namespace {

constexpr size_t kAlign = 512;
constexpr size_t kReleaseBytes = size_t(32) << 20;  // free blocks this large return their pages

struct Arena {
  c10::DeviceIndex index = 0;
  char* fake = nullptr;
  char* real = nullptr;
  size_t size = 0;
  std::mutex mu;
  std::map<size_t, size_t> free_by_offset;           // offset -> length
  std::set<std::pair<size_t, size_t>> free_by_length;  // (length, offset)
  std::unordered_map<size_t, size_t> used;             // offset -> length
  int64_t allocated = 0, peak = 0;
  size_t high_water = 0;

  void reserve() {
    size_t want = size_t(64) << 30;
    if (const char* env = std::getenv("ACCURACY_NPU_MEMORY_GB")) {
      long gb = std::atol(env);
      if (gb > 0) want = size_t(gb) << 30;
    }
    for (size_t n = want; n >= (size_t(256) << 20); n /= 2) {
      void* f = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (f == MAP_FAILED) continue;
      void* r = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (r == MAP_FAILED) {
        munmap(f, n);
        continue;
      }
      fake = static_cast<char*>(f);
      real = static_cast<char*>(r);
      size = n;
      free_by_offset[0] = n;
      free_by_length.insert({n, 0});
      return;
    }
    TORCH_CHECK(false, "npu test device: cannot reserve address space for device ", int(index),
                " (set ACCURACY_NPU_MEMORY_GB to a smaller size)");
  }

  size_t take(size_t nbytes) {
    size_t n = (nbytes + kAlign - 1) / kAlign * kAlign;
    std::lock_guard<std::mutex> lock(mu);
    auto it = free_by_length.lower_bound({n, 0});
    TORCH_CHECK_WITH(OutOfMemoryError, it != free_by_length.end(),
                     "npu out of memory: tried to allocate ", nbytes, " bytes on npu:", int(index),
                     " (", allocated, " bytes allocated of ", size, ")");
    auto [length, offset] = *it;
    free_by_length.erase(it);
    free_by_offset.erase(offset);
    if (length > n) {
      free_by_offset[offset + n] = length - n;
      free_by_length.insert({length - n, offset + n});
    }
    used[offset] = n;
    allocated += int64_t(n);
    peak = std::max(peak, allocated);
    high_water = std::max(high_water, offset + n);
    return offset;
  }

  void give(size_t offset) {
    std::lock_guard<std::mutex> lock(mu);
    auto u = used.find(offset);
    TORCH_INTERNAL_ASSERT(u != used.end(), "npu test device: freeing an unknown block");
    size_t length = u->second;
    used.erase(u);
    allocated -= int64_t(length);
    if (length >= kReleaseBytes) {
      uintptr_t page = 4096, lo = uintptr_t(real + offset), hi = lo + length;
      lo = (lo + page - 1) / page * page;
      hi = hi / page * page;
      if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    }
    auto next = free_by_offset.find(offset + length);
    if (next != free_by_offset.end()) {
      free_by_length.erase({next->second, next->first});
      length += next->second;
      free_by_offset.erase(next);
    }
    auto prev = free_by_offset.lower_bound(offset);
    if (prev != free_by_offset.begin()) {
      --prev;
      if (prev->first + prev->second == offset) {
        free_by_length.erase({prev->second, prev->first});
        offset = prev->first;
        length += prev->second;
        free_by_offset.erase(prev);
      }
    }
    free_by_offset[offset] = length;
    free_by_length.insert({length, offset});
  }

  bool holds(const void* p) const {
    auto c = static_cast<const char*>(p);
    return fake != nullptr && c >= fake && c < fake + size;
  }
};

Arena* arenas() {
  static Arena* all = [] {
    auto* a = new Arena[kDeviceCount];  // never freed: tensors may die at interpreter exit
    for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) {
      a[i].index = i;
      a[i].reserve();
    }
    return a;
  }();
  return all;
}

Arena* arena_of(const void* p) {
  Arena* all = arenas();
  for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i)
    if (all[i].holds(p)) return &all[i];
  return nullptr;
}

void free_device(void* ctx) {
  if (ctx == nullptr) return;
  Arena* a = arena_of(ctx);
  TORCH_INTERNAL_ASSERT(a != nullptr, "npu test device: freeing a foreign pointer");
  a->give(static_cast<char*>(ctx) - a->fake);
}

struct DeviceAllocator final : c10::Allocator {
  c10::DeviceIndex index = 0;
  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device device(c10::DeviceType::PrivateUse1, index);
    if (nbytes == 0) return {nullptr, nullptr, &free_device, device};
    Arena& a = arenas()[index];
    char* p = a.fake + a.take(nbytes);
    return {p, p, &free_device, device};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device;
  }
  // Used by copy-on-write materialisation and Storage clones: ordered after queued kernels.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count == 0) return;
    drain_all("Allocator::copy_data");
    std::memcpy(real_address(dest), real_address(src), count);
  }
};

// What c10::GetAllocator(PrivateUse1) returns (torch.UntypedStorage(n, device="npu"),
// serialization): allocates on the current device, as CUDA's allocator does.
struct CurrentDeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    return device_allocator(current_device())->allocate(nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    device_allocator(current_device())->copy_data(dest, src, count);
  }
};

// ---- pinned host memory ----
std::mutex pinned_mu;
std::map<uintptr_t, size_t> pinned_blocks;  // base -> length
int64_t pinned_total = 0;

void free_pinned(void* p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pinned_mu);
    auto it = pinned_blocks.find(uintptr_t(p));
    if (it != pinned_blocks.end()) {
      pinned_total -= int64_t(it->second);
      pinned_blocks.erase(it);
    }
  }
  std::free(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device cpu(c10::DeviceType::CPU);
    if (nbytes == 0) return {nullptr, nullptr, &free_pinned, cpu};
    void* p = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, 4096, nbytes) == 0,
                     "npu test device: cannot allocate ", nbytes, " bytes of pinned memory");
    std::lock_guard<std::mutex> lock(pinned_mu);
    pinned_blocks[uintptr_t(p)] = nbytes;
    pinned_total += int64_t(nbytes);
    return {p, p, &free_pinned, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

void* real_address(const void* p) {
  if (p == nullptr) return nullptr;
  Arena* a = arena_of(p);
  TORCH_CHECK(a != nullptr, "npu test device: ", p, " is not a device address");
  return a->real + (static_cast<const char*>(p) - a->fake);
}

c10::DeviceIndex device_of(const void* p) {
  Arena* a = p == nullptr ? nullptr : arena_of(p);
  return a == nullptr ? -1 : a->index;
}

c10::Allocator* device_allocator(c10::DeviceIndex index) {
  static DeviceAllocator* all = [] {
    auto* a = new DeviceAllocator[kDeviceCount];
    for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) a[i].index = i;
    return a;
  }();
  return &all[check_index(index)];
}

c10::Allocator* current_device_allocator() {
  static auto* a = new CurrentDeviceAllocator();
  return a;
}

c10::Allocator* pinned_allocator() {
  static auto* a = new PinnedAllocator();
  return a;
}

bool is_pinned(const void* p) {
  if (p == nullptr) return false;
  std::lock_guard<std::mutex> lock(pinned_mu);
  auto it = pinned_blocks.upper_bound(uintptr_t(p));
  if (it == pinned_blocks.begin()) return false;
  --it;
  return uintptr_t(p) < it->first + it->second;
}

MemoryStats memory_stats(c10::DeviceIndex index) {
  Arena& a = arenas()[check_index(index)];
  std::lock_guard<std::mutex> lock(a.mu);
  return {a.allocated, a.peak, int64_t(a.high_water), int64_t(a.size)};
}

void reset_peak(c10::DeviceIndex index) {
  Arena& a = arenas()[check_index(index)];
  std::lock_guard<std::mutex> lock(a.mu);
  a.peak = a.allocated;
}

int64_t pinned_bytes() {
  std::lock_guard<std::mutex> lock(pinned_mu);
  return pinned_total;
}

}  // namespace accuracy_npu
