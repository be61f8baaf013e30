// The device's kernels: a boxed fallback that runs PyTorch's CPU kernels asynchronously on the
// device queue, and the few ops a backend must own (allocation, copies, views, resize, item).
//
// How an op runs (npu_fallback):
//  - view ops (every return aliases an argument, none written) never reach the queue: the Meta
//    kernel gives the view's sizes, strides and offset over the same storage;
//  - ops whose outputs depend on the data (nonzero, unique, masked_select, equal...), ops
//    returning something other than tensors, and ops without a usable Meta kernel drain the
//    queue and run now on the host ("run_now");
//  - every other op ("run_queued"): the Meta kernel on meta tensors of the same sizes, strides,
//    offsets and dtypes gives the outputs' shapes; they are allocated on the device at once and
//    the CPU kernel is queued. It runs on CPU aliases of the device memory: out= and in-place
//    arguments are written directly, fresh outputs are copied into the preallocated ones.
//    The queued closure owns references to every storage it touches.
// Random ops get a CPU generator seeded from the device generator's (seed, offset), taken on
// the host when the op is issued, so the draw does not depend on when the kernel runs.
#include "npu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace accuracy_npu {
namespace {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;
using Stack = std::vector<c10::IValue>;

// Our own internal ops are implementation, not user ops: a dispatch mode never sees them.
c10::DispatchKeySet python_keys() {
  return c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
}

bool is_npu(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNpu;
}

// ---- aliases of device storage --------------------------------------------------------------

void delete_storage(void* ctx) {
  delete static_cast<c10::Storage*>(ctx);
}

at::Tensor make_alias(c10::Storage storage, const at::Tensor& like, c10::DispatchKey key) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  impl->_set_conj(like.is_conj());
  impl->_set_neg(like.is_neg());
  return at::Tensor(std::move(impl));
}

// CPU (or meta) tensors over device storages, one alias storage per device storage so that
// aliasing between the arguments of one call is kept (overlap checks, in-place on views).
class Aliases {
 public:
  explicit Aliases(c10::DeviceType target) : target_(target) {}

  at::Tensor of(const at::Tensor& t) {
    if (!t.defined()) return t;
    TORCH_CHECK(t.has_storage(), "npu test device: tensors without storage are not supported");
    c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    auto it = by_device_.find(si);
    if (it == by_device_.end()) {
      if (c10::impl::cow::is_cow_data_ptr(si->data_ptr())) si->mutable_data_ptr();  // own bytes
      c10::Storage alias = target_ == c10::DeviceType::Meta ? meta_storage(si) : host_storage(t);
      by_alias_.emplace(alias.unsafeGetStorageImpl(), t.storage());
      it = by_device_.emplace(si, std::move(alias)).first;
    }
    return make_alias(it->second, t,
                      target_ == c10::DeviceType::Meta ? c10::DispatchKey::Meta : c10::DispatchKey::CPU);
  }

  // The device storage behind an alias storage, or nullptr.
  const c10::Storage* device_storage(const at::Tensor& alias) const {
    if (!alias.defined() || !alias.has_storage()) return nullptr;
    auto it = by_alias_.find(alias.storage().unsafeGetStorageImpl());
    return it == by_alias_.end() ? nullptr : &it->second;
  }

 private:
  static c10::Storage meta_storage(c10::StorageImpl* si) {
    c10::Allocator* a = c10::GetAllocator(c10::DeviceType::Meta);
    return c10::Storage(c10::Storage::use_byte_size_t(), si->nbytes(), a->allocate(0), a, true);
  }
  static c10::Storage host_storage(const at::Tensor& t) {
    c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    void* real = real_address(si->data_ptr().get());
    auto* owner = new c10::Storage(t.storage());  // the alias keeps the device memory alive
    c10::DataPtr ptr(real, owner, &delete_storage, c10::Device(c10::DeviceType::CPU));
    return c10::Storage(c10::Storage::use_byte_size_t(), si->nbytes(), std::move(ptr), nullptr,
                        false);
  }

  c10::DeviceType target_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> by_device_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> by_alias_;
};

// A device tensor viewing `base`'s storage with `like`'s dtype, sizes, strides and offset.
at::Tensor device_view(const c10::Storage& storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(storage),
                                                   keys, like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  impl->_set_conj(like.is_conj());
  impl->_set_neg(like.is_neg());
  return at::Tensor(std::move(impl));
}

// A CPU tensor on `t`'s own storage (not `t` itself: a queued task must not hold the tensor a
// Python object may own, only its bytes).
at::Tensor cpu_twin(const at::Tensor& t) {
  return make_alias(t.storage(), t, c10::DispatchKey::CPU);
}

at::Tensor snapshot(const at::Tensor& t) {
  at::Tensor c = t.clone();
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) c.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c;
}

// ---- IValue traversal ---------------------------------------------------------------------------

bool holds_tensors(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto o = t->castRaw<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::TensorType;
}

template <class F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return c10::IValue(f(v.toTensor()));
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    auto in = v.toTensorList();
    out.reserve(in.size());
    for (at::Tensor t : in) out.push_back(f(t));
    return c10::IValue(std::move(out));
  }
  if (v.isList()) {
    auto in = v.toList();
    if (!holds_tensors(in.elementType())) return v;
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (c10::IValue e : in) out.push_back(map_tensors(e, f));
    return c10::IValue(std::move(out));
  }
  return v;
}

template <class F>
void visit_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (at::Tensor t : v.toTensorList()) f(t);
  } else if (v.isList() && holds_tensors(v.toList().elementType())) {
    for (c10::IValue e : v.toList()) visit_tensors(e, f);
  }
}

// ---- what an op is -----------------------------------------------------------------------------

enum class Ret { Fresh, Written, View, Other };

bool returns_tensor(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto l = t->castRaw<c10::ListType>()) t = l->getElementType();
  return holds_tensors(t);
}

bool is_generator(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto o = t->castRaw<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::GeneratorType;
}

struct OpInfo {
  std::string name;  // aten::add.out
  size_t num_args = 0, num_returns = 0;
  std::vector<bool> generator_arg, written_arg;
  std::vector<Ret> ret;
  std::vector<int> ret_arg;  // the argument a Written or View return aliases
  bool view = false;         // every return a view of an argument: metadata only
  bool data_dependent = false;
  bool host_tensors_ok = false;  // takes CPU index tensors, as CUDA's indexing does
  bool has_cpu_kernel = true;
};

// Output sizes depend on the values: the queue is drained and the op runs now.
const std::unordered_set<std::string>& data_dependent_ops() {
  static const std::unordered_set<std::string> names = {
      "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2",
      "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
      "aten::bincount", "aten::equal", "aten::is_nonzero"};
  return names;
}

const std::unordered_set<std::string>& host_index_ops() {
  static const std::unordered_set<std::string> names = {
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
      "aten::_unsafe_index", "aten::_unsafe_index_put"};
  return names;
}

OpInfo describe(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& s = op.schema();
  OpInfo info;
  info.name = s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name());
  info.num_args = s.arguments().size();
  info.num_returns = s.returns().size();
  for (const c10::Argument& a : s.arguments()) {
    info.generator_arg.push_back(is_generator(a.type()));
    info.written_arg.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
  }
  size_t views = 0;
  for (const c10::Argument& r : s.returns()) {
    Ret kind = Ret::Other;
    int arg = -1;
    if (returns_tensor(r.type())) {
      const c10::AliasInfo* ai = r.alias_info();
      kind = ai == nullptr ? Ret::Fresh : ai->isWrite() ? Ret::Written : Ret::View;
      if (ai != nullptr) {
        for (size_t i = 0; i < s.arguments().size(); ++i) {
          const c10::AliasInfo* aa = s.arguments()[i].alias_info();
          if (aa != nullptr && aa->beforeSets() == ai->beforeSets()) {
            arg = int(i);
            break;
          }
        }
        if (arg < 0) kind = Ret::Other;
      }
    }
    views += kind == Ret::View;
    info.ret.push_back(kind);
    info.ret_arg.push_back(arg);
  }
  info.view = views > 0 && views == info.num_returns;
  bool other = std::any_of(info.ret.begin(), info.ret.end(), [](Ret k) { return k == Ret::Other; });
  info.data_dependent = data_dependent_ops().count(s.name()) > 0 || other ||
                        (views > 0 && !info.view);
  info.host_tensors_ok = host_index_ops().count(s.name()) > 0;
  info.has_cpu_kernel = op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
  return info;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*cache)[&op.schema()];
  if (!slot) slot = std::make_unique<OpInfo>(describe(op));
  return *slot;
}

// The device the op runs on; checks that its tensors are where CUDA would want them.
c10::DeviceIndex placement(const OpInfo& info, const Stack& args) {
  c10::DeviceIndex dev = -1;
  std::string host_arg;
  for (size_t i = 0; i < args.size(); ++i) {
    visit_tensors(args[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.device().type() == kNpu) {
        c10::DeviceIndex d = t.device().index();
        TORCH_CHECK(dev == -1 || dev == d,
                    "Expected all tensors to be on the same device, but found at least two "
                    "devices, npu:", int(dev), " and npu:", int(d), "! (in ", info.name, ")");
        dev = d;
      } else if (t.is_cpu()) {
        if (t.dim() > 0 && !info.host_tensors_ok) host_arg = std::to_string(i);
      } else {
        TORCH_CHECK(false, "npu test device: ", info.name, " got a tensor on ", t.device());
      }
    });
    if (dev == -1 && args[i].isDevice() && args[i].toDevice().type() == kNpu)
      dev = check_index(args[i].toDevice().index());
  }
  if (dev == -1) dev = current_device();
  TORCH_CHECK(host_arg.empty(),
              "Expected all tensors to be on the same device, but found at least two devices, "
              "npu:", int(dev), " and cpu! (argument ", host_arg, " of ", info.name, ")");
  return dev;
}

c10::DeviceIndex index_of_option(std::optional<c10::Device> device) {
  if (!device.has_value() || !device->has_index()) return current_device();
  TORCH_CHECK(device->type() == kNpu, "npu test device: asked to allocate on ", *device);
  return check_index(device->index());
}

// ---- allocation, resize -----------------------------------------------------------------------

at::Tensor npu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                             std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == at::kStrided,
              "npu test device: only strided tensors are supported");
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  c10::DeviceIndex dev = index_of_option(device);
  return at::detail::empty_strided_generic(size, stride, device_allocator(dev),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor npu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                     std::optional<at::Layout> layout, std::optional<at::Device> device,
                     std::optional<bool> pin_memory,
                     std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == at::kStrided,
              "npu test device: only strided tensors are supported");
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  c10::DeviceIndex dev = index_of_option(device);
  return at::detail::empty_generic(size, device_allocator(dev),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

// A fresh device tensor shaped like `like` (its strides when they are dense, else contiguous).
at::Tensor empty_like_on(const at::Tensor& like, c10::DeviceIndex dev) {
  if (!like.defined()) return like;
  if (like.is_non_overlapping_and_dense())
    return npu_empty_strided(like.sizes(), like.strides(), like.scalar_type(), std::nullopt,
                             c10::Device(kNpu, dev), std::nullopt);
  return npu_empty(like.sizes(), like.scalar_type(), std::nullopt, c10::Device(kNpu, dev),
                   std::nullopt, std::nullopt);
}

void ensure_storage(const at::Tensor& t) {
  size_t need = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.dtype().itemsize(),
                                                 size_t(t.storage_offset()));
  if (need > t.storage().nbytes()) resize_bytes(t.storage(), need);
}

const at::Tensor& npu_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              std::optional<at::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) {
    impl->set_sizes_contiguous(size);
    ensure_storage(self);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve,
                "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
    ensure_storage(self);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNpu, "npu test device: set_() to a storage on ",
              source.device());
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty())
    impl->set_sizes_contiguous(size);
  else
    impl->set_sizes_and_strides(size, stride);
  ensure_storage(self);
  return self;
}

at::Tensor& npu_set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                                   c10::IntArrayRef size, c10::IntArrayRef stride) {
  return set_storage(self, std::move(source), offset, size, stride);
}

at::Tensor& npu_set_storage_whole(at::Tensor& self, c10::Storage source) {
  int64_t n = int64_t(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& npu_set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& npu_set_empty(at::Tensor& self) {
  c10::DeviceIndex dev = self.device().index();
  c10::Allocator* a = device_allocator(dev);
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, a->allocate(0), a, true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

// ---- copies and item() ---------------------------------------------------------------------------

at::Tensor npu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  c10::impl::ExcludeDispatchKeyGuard no_python(python_keys());
  const bool from_npu = is_npu(self), to_npu = is_npu(dst);
  TORCH_CHECK((from_npu || self.is_cpu()) && (to_npu || dst.is_cpu()),
              "npu test device: copies between npu and cpu only, not from ", self.device(),
              " to ", dst.device());
  if (dst.numel() == 0) return dst;
  const int64_t bytes = int64_t(self.nbytes());
  Counters& c = counters();
  if (from_npu && to_npu) {
    c.d2d_copies++;
    c.d2d_bytes += bytes;
    at::Tensor src = host_alias(self), out = host_alias(dst);
    c10::DeviceIndex sdev = self.device().index(), ddev = dst.device().index();
    if (sdev == ddev) {
      enqueue(ddev, "copy_ (npu to npu)", [src, out]() mutable { out.copy_(src); });
    } else {
      drain(sdev, "copy_ (npu to npu across devices)");
      drain(ddev, "copy_ (npu to npu across devices)");
      out.copy_(src);
    }
  } else if (from_npu) {
    c.d2h_copies++;
    c.d2h_bytes += bytes;
    at::Tensor src = host_alias(self);
    c10::DeviceIndex dev = self.device().index();
    if (non_blocking && is_pinned(dst.storage().data())) {
      c.d2h_nonblocking++;
      at::Tensor out = cpu_twin(dst);
      enqueue(dev, "copy_ (npu to host, non_blocking)", [src, out]() mutable { out.copy_(src); });
    } else {
      drain(dev, "copy_ (npu to host)");
      dst.copy_(src);
    }
  } else {
    c.h2d_copies++;
    c.h2d_bytes += bytes;
    at::Tensor out = host_alias(dst);
    c10::DeviceIndex dev = dst.device().index();
    if (non_blocking) {
      // From pinned memory the device reads the host buffer when the copy runs (as a DMA
      // does); from pageable memory the bytes are staged now.
      c.h2d_nonblocking++;
      at::Tensor src = is_pinned(self.storage().data()) ? cpu_twin(self) : snapshot(self);
      enqueue(dev, "copy_ (host to npu, non_blocking)", [src, out]() mutable { out.copy_(src); });
    } else {
      drain(dev, "copy_ (host to npu)");
      out.copy_(self);
    }
  }
  return dst;
}

at::Tensor npu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (is_npu(dst))
      npu_resize_(dst, self.sizes(), std::nullopt);
    else
      dst.resize_(self.sizes());
  }
  return npu_copy_from(self, dst, false);
}

at::Scalar npu_local_scalar_dense(const at::Tensor& self) {
  c10::impl::ExcludeDispatchKeyGuard no_python(python_keys());
  drain(self.device().index(), "aten::_local_scalar_dense");
  counters().d2h_copies++;
  counters().d2h_bytes += int64_t(self.element_size());
  return at::_local_scalar_dense(host_alias(self));
}

void npu_record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {
  // Nothing to do: queued kernels own references to the memory they use.
}

// CPU's native_dropout draws from CPU's default generator (it takes none): on a device the
// mask must come from the device's generator, so it is composed of ops that take one.
std::tuple<at::Tensor, at::Tensor> npu_native_dropout(const at::Tensor& input, double p,
                                                      std::optional<bool> train) {
  c10::impl::ExcludeDispatchKeyGuard no_python(python_keys());
  if (input.numel() == 0) return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  double keep = 1. - p;
  double scale = keep == 0 ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool)).bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

// ---- the fallback ---------------------------------------------------------------------------------

struct Launch {
  Launch(c10::OperatorHandle op, std::string name) : op(std::move(op)), name(std::move(name)) {}
  c10::OperatorHandle op;
  Stack stack;  // the CPU kernel's arguments: aliases of device memory, snapshots, generators
  std::vector<std::pair<size_t, c10::IValue>> fresh;  // return index -> aliases of its outputs
  std::string name;

  void copy_result(const c10::IValue& into, const c10::IValue& result) {
    if (into.isTensor()) {
      at::Tensor dst = into.toTensor();
      if (!dst.defined()) return;
      TORCH_CHECK(result.isTensor() && result.toTensor().sizes() == dst.sizes(),
                  "the CPU kernel's output does not have the shape its Meta kernel gave");
      dst.copy_(result.toTensor());
    } else if (into.isTensorList()) {
      auto dsts = into.toTensorList();
      auto results = result.toTensorList();
      TORCH_CHECK(dsts.size() == results.size(), "the CPU kernel returned ", results.size(),
                  " tensors, its Meta kernel ", dsts.size());
      for (size_t i = 0; i < dsts.size(); ++i) copy_result(dsts.get(i), results.get(i));
    } else if (into.isList()) {
      auto dsts = into.toList();
      auto results = result.toList();
      for (size_t i = 0; i < dsts.size(); ++i) copy_result(dsts.get(i), results.get(i));
    }
  }

  void run() {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    for (auto& [index, into] : fresh) copy_result(into, stack[index]);
    stack.clear();
  }
};

// The CPU kernel's arguments. `snapshot_host`: CPU tensors given by the caller are copied now
// (a queued kernel reads them later, a CUDA kernel reads them at launch).
Stack host_stack(const OpInfo& info, const Stack& args, Aliases& host, c10::DeviceIndex dev,
                 bool snapshot_host) {
  Stack out;
  out.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (info.generator_arg[i]) {
      std::optional<at::Generator> gen;
      if (v.isGenerator()) gen = v.toGenerator();
      out.emplace_back(kernel_generator(gen, dev));
    } else if (v.isDevice() && v.toDevice().type() == kNpu) {
      out.emplace_back(c10::Device(c10::DeviceType::CPU));
    } else {
      out.push_back(map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
        if (is_npu(t)) return host.of(t);
        return snapshot_host && t.defined() ? snapshot(t) : t;
      }));
    }
  }
  return out;
}

Stack meta_stack(const OpInfo& info, const Stack& args, Aliases& meta) {
  Stack out;
  out.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (info.generator_arg[i]) {
      out.emplace_back();
    } else if (v.isDevice() && v.toDevice().type() == kNpu) {
      out.emplace_back(c10::Device(c10::DeviceType::Meta));
    } else {
      out.push_back(map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
        if (is_npu(t)) return meta.of(t);
        if (t.defined() && t.dim() > 0)  // host index tensors
          return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::DeviceType::Meta));
        return t;  // CPU scalars stay: TensorIterator accepts them beside any device
      }));
    }
  }
  return out;
}

// A CPU result of a kernel run now, as a device tensor: a view where it aliases an argument's
// memory, else a fresh device tensor holding its values.
c10::IValue to_device(const c10::IValue& v, Aliases& host, c10::DeviceIndex dev) {
  return map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || is_npu(t)) return t;
    if (const c10::Storage* s = host.device_storage(t))
      return device_view(*s, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t);
    at::Tensor out = empty_like_on(t, dev);
    host_alias(out).copy_(t);
    return out;
  });
}

void run_now(const c10::OperatorHandle& op, const OpInfo& info, const Stack& args,
             c10::DeviceIndex dev, Stack* results, const std::string& reason) {
  drain(dev, reason);
  counters().kernels_sync++;
  Aliases host(c10::DeviceType::CPU);
  Stack stack = host_stack(info, args, host, dev, false);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  }
  for (size_t i = 0; i < info.num_returns; ++i) {
    if (info.ret[i] == Ret::Written)
      results->push_back(args[info.ret_arg[i]]);
    else
      results->push_back(to_device(stack[i], host, dev));
  }
}

bool run_view(const c10::OperatorHandle& op, const OpInfo& info, const Stack& args,
              Stack* results) {
  Aliases meta(c10::DeviceType::Meta);
  Stack stack = meta_stack(info, args, meta);
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const std::exception&) {
    return false;
  }
  for (size_t i = 0; i < info.num_returns; ++i) {
    const at::Tensor& base = args[info.ret_arg[i]].toTensor();
    results->push_back(map_tensors(stack[i], [&](const at::Tensor& m) -> at::Tensor {
      return device_view(base.storage(), base.key_set(), m);
    }));
  }
  return true;
}

// Mirror on the device tensor what the Meta kernel did to an out= argument (resize, restride).
void follow_meta(const at::Tensor& device, const at::Tensor& meta) {
  if (!is_npu(device) || !meta.defined()) return;
  if (device.sizes() == meta.sizes() && device.strides() == meta.strides()) return;
  device.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(),
                                                      device.storage_offset());
  ensure_storage(device);
}

void follow_meta_all(const c10::IValue& device, const c10::IValue& meta) {
  if (device.isTensor()) {
    follow_meta(device.toTensor(), meta.toTensor());
  } else if (device.isTensorList()) {
    auto d = device.toTensorList();
    auto m = meta.toTensorList();
    for (size_t i = 0; i < d.size(); ++i) follow_meta(d.get(i), m.get(i));
  }
}

bool run_queued(const c10::OperatorHandle& op, const OpInfo& info, const Stack& args,
                c10::DeviceIndex dev, Stack* results) {
  Aliases meta(c10::DeviceType::Meta);
  Stack margs = meta_stack(info, args, meta);
  Stack mstack = margs;
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &mstack);
  } catch (const std::exception&) {
    return false;  // no Meta kernel, or one that needs the data: run it now
  }
  for (size_t i = 0; i < info.num_args; ++i)
    if (info.written_arg[i]) follow_meta_all(args[i], margs[i]);

  Aliases host(c10::DeviceType::CPU);
  auto launch = std::make_shared<Launch>(op, info.name);
  for (size_t i = 0; i < info.num_returns; ++i) {
    if (info.ret[i] == Ret::Written) {
      results->push_back(args[info.ret_arg[i]]);
      continue;
    }
    c10::IValue out = map_tensors(mstack[i], [&](const at::Tensor& m) { return empty_like_on(m, dev); });
    launch->fresh.emplace_back(i, map_tensors(out, [&](const at::Tensor& t) { return host.of(t); }));
    results->push_back(std::move(out));
  }
  launch->stack = host_stack(info, args, host, dev, true);
  enqueue(dev, info.name, [launch] { launch->run(); });
  return true;
}

void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_not_forked();
  const OpInfo& info = op_info(op);
  TORCH_CHECK_NOT_IMPLEMENTED(info.has_cpu_kernel, "npu test device: ", info.name,
                              " has no CPU kernel to run (a device-only op that this device "
                              "does not implement)");
  Stack args(std::make_move_iterator(stack->end() - info.num_args),
             std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - info.num_args, stack->end());
  c10::DeviceIndex dev = placement(info, args);
  c10::impl::ExcludeDispatchKeyGuard no_python(python_keys());
  Stack results;
  results.reserve(info.num_returns);
  bool done = false;
  if (info.view) {
    done = run_view(op, info, args, &results);
  } else if (!info.data_dependent) {
    done = run_queued(op, info, args, dev, &results);
  }
  if (!done) {
    results.clear();
    run_now(op, info, args, dev, &results, info.name);
  }
  for (auto& r : results) stack->push_back(std::move(r));
}

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_op(op, stack);
}

// ATen sends convolutions on backends it does not know to these two; they run as CPU's.
at::Tensor npu_convolution(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  Stack stack{input, weight, bias, stride, padding, dilation, transposed, output_padding, groups};
  run_op(op, &stack);
  return stack[0].toTensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> npu_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  int64_t bias_size = transposed ? weight.size(1) * groups : weight.size(0);
  Stack stack{grad_output, input, weight, std::vector<int64_t>{bias_size}, stride, padding,
              dilation, transposed, output_padding, groups, output_mask};
  run_op(op, &stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  TORCH_CHECK(is_npu(t), "npu test device: host_alias of a tensor on ", t.device());
  Aliases host(c10::DeviceType::CPU);
  return host.of(t);
}

void resize_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceIndex dev = storage.device().index();
  size_t old = storage.nbytes();
  c10::DataPtr fresh = device_allocator(dev)->allocate(nbytes);
  void* dst = fresh.get();
  c10::DataPtr previous = storage.set_data_ptr(std::move(fresh));
  storage.set_nbytes(nbytes);
  if (previous.get() == nullptr) return;
  // Kernels queued before still read or write the old bytes: they are copied, then freed,
  // in queue order.
  auto held = std::make_shared<c10::DataPtr>(std::move(previous));
  size_t count = std::min(old, nbytes);
  void* from = real_address(held->get());
  void* to = count > 0 ? real_address(dst) : nullptr;
  c10::Storage keep = storage;
  enqueue(dev, "resize (copy)", [held, keep, from, to, count] {
    if (count > 0) std::memcpy(to, from, count);
  });
}

// `module.to("npu")` keeps each Parameter object (so weights tied on CPU stay tied, as on CUDA)
// only where `param.data = moved` is allowed: c10 lists the dense backends it allows, and
// PrivateUse1 is not one of them; a vendor's extension says its tensors are dense here.
bool npu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || t.is_privateuseone());
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self) && dense(from));
}

}  // namespace accuracy_npu

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&accuracy_npu::npu_fallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace accuracy_npu;
  m.impl("empty.memory_format", TORCH_FN(npu_empty));
  m.impl("empty_strided", TORCH_FN(npu_empty_strided));
  m.impl("_copy_from", TORCH_FN(npu_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(npu_copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(npu_local_scalar_dense));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("resize_", TORCH_FN(npu_resize_));
  m.impl("set_.source_Storage", TORCH_FN(npu_set_storage_whole));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(npu_set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(npu_set_tensor));
  m.impl("set_", TORCH_FN(npu_set_empty));
  m.impl("native_dropout", TORCH_FN(npu_native_dropout));
  m.impl("record_stream", TORCH_FN(npu_record_stream));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(npu_has_compatible_shallow_copy_type));
  m.impl("convolution_overrideable", TORCH_FN(npu_convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(npu_convolution_backward));
  // These have a CPU kernel and a composite one that every other device would get: run CPU's,
  // so the device computes what CPU computes.
  for (const char* name : {"native_layer_norm", "native_group_norm", "addr", "addr.out",
                           "_stack", "_stack.out", "all.dims", "all.dims_out", "any.dims",
                           "any.dims_out"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}
