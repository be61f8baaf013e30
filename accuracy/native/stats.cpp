// A recorded CPU tensor's statistics in one call and one pass: what accuracy/dumpfile/stats.py
// computes with several numpy/torch reductions and a Python call each.
//
// Built and cached by accuracy/native/cppext.py, loaded by accuracy/native/fastpath.py, called
// once per tensor the statistics dump describes. `stats(t, sums)` gives the same tuple as
// `tensor_stats`: ((min, max, mean, l2, nan_count, inf_count), checksum), or None for what it
// does not take (complex and unsigned >8-bit dtypes, sparse layouts, meta tensors): the
// caller's Python path then runs, as it does without a compiler or with ACCURACY_NATIVE=0. A
// tensor on an accelerator gets the Python path's device figures, launched from C++
// (`device_stats`).
//
// Figures: values are widened to double and summed in double (the Python path sums fp32 in
// fp32 for large tensors: the two agree to fp32 rounding); min and max are NaN when a NaN is
// present (as torch's aminmax and numpy's min are); NaN and inf are counted only when min or
// max is not finite (then the first pass saw one). The checksum is the wrapping sum of the raw
// bit patterns, bytes unsigned, wider types signed, accumulated in int32 (int64 for 8-byte
// types): bit for bit what the other paths store. No -ffast-math: `omp simd` reductions
// vectorise without it and NaN/inf stay what IEEE says.
//
// Large tensors are reduced in fixed 64 Ki-element chunks over torch's intra-op threads with
// the GIL released, and the chunks combined in order: the same figures whatever the thread
// count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e4m3fnuz.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Float8_e5m2fnuz.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int64_t kChunk = 1 << 16;
constexpr int64_t kReleaseGil = 1 << 14;  // below this a pass is cheaper than the GIL hand-off

struct Partial {
  double mn = std::numeric_limits<double>::infinity();
  double mx = -std::numeric_limits<double>::infinity();
  double sum = 0.0;
  double sumsq = 0.0;
  uint64_t bits = 0;
};

// Each element as a double, and its raw bits widened as the checksum adds them.
template <typename T>
struct Elem {
  static double value(const T* x, int64_t i) { return static_cast<double>(x[i]); }
};
template <>
struct Elem<c10::BFloat16> {
  static double value(const c10::BFloat16* x, int64_t i) {
    uint32_t w = static_cast<uint32_t>(x[i].x) << 16;
    float f;
    std::memcpy(&f, &w, sizeof f);
    return f;
  }
};
template <>
struct Elem<bool> {
  static double value(const bool* x, int64_t i) {
    return static_cast<double>(reinterpret_cast<const uint8_t*>(x)[i]);
  }
};

// The checksum's accumulator: it wraps at 32 bits (64 for 8-byte types), as stored.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

// The bit pattern of element i as the checksum adds it: bytes unsigned, wider types signed.
template <typename T>
inline Bits<T> bits_of(const T* x, int64_t i) {
  if constexpr (sizeof(T) == 1) {
    return reinterpret_cast<const uint8_t*>(x)[i];
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<uint32_t>(static_cast<int32_t>(reinterpret_cast<const int16_t*>(x)[i]));
  } else if constexpr (sizeof(T) == 4) {
    return reinterpret_cast<const uint32_t*>(x)[i];
  } else {
    return reinterpret_cast<const uint64_t*>(x)[i];
  }
}

// min and max kept in the element's own type where it is float (twice the lanes of double:
// exact, a comparison rounds nothing); the sums always in double.
template <typename T>
using Extreme = std::conditional_t<std::is_same_v<T, float>, float, double>;

// One pass: min and max (in the element's float type where that is exact), the sum of squares
// in double, and with `Full` the sum and the checksum's bits (the dump's figures; the monitor's
// norms need neither, and skip their lanes).
template <typename T, bool Full = true>
Partial pass(const T* x, int64_t n) {
  using M = Extreme<T>;
  M mn = std::numeric_limits<M>::infinity();
  M mx = -mn;
  double sum = 0.0, sumsq = 0.0;
  Bits<T> bits = 0;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : sum, sumsq, bits)
  for (int64_t i = 0; i < n; i++) {
    M e = static_cast<M>(Elem<T>::value(x, i));
    double v = e;
    mn = e < mn ? e : mn;
    mx = e > mx ? e : mx;
    sumsq += v * v;
    if constexpr (Full) {
      sum += v;
      bits += bits_of(x, i);
    }
  }
  return Partial{mn, mx, sum, sumsq, bits};
}

// `p` (the pass over the elements after `all`'s) folded into `all`.
inline void merge(Partial& all, const Partial& p) {
  all.mn = p.mn < all.mn ? p.mn : all.mn;
  all.mx = p.mx > all.mx ? p.mx : all.mx;
  all.sum += p.sum;
  all.sumsq += p.sumsq;
  all.bits += p.bits;
}

template <typename T>
Partial reduce(const T* x, int64_t n) {
  if (n <= 2 * kChunk) {
    return pass(x, n);
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Partial> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; c++) {
      const int64_t lo = c * kChunk;
      parts[c] = pass(x + lo, std::min(kChunk, n - lo));
    }
  });
  Partial all = parts[0];
  for (int64_t c = 1; c < chunks; c++) {
    merge(all, parts[c]);
  }
  return all;
}

// NaN and inf counted apart (only when the pass saw a non-finite value).
template <typename T>
std::pair<int64_t, int64_t> non_finite(const T* x, int64_t n) {
  int64_t nans = 0, infs = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = Elem<T>::value(x, i);
    nans += std::isnan(v);
    infs += std::isinf(v);
  }
  return {nans, infs};
}

template <typename T>
py::object figures(const at::Tensor& t, int64_t n, bool floating, bool sums) {
  const T* x = static_cast<const T*>(t.const_data_ptr());
  Partial p;
  std::pair<int64_t, int64_t> counts{0, 0};
  {
    std::optional<py::gil_scoped_release> nogil;
    if (n >= kReleaseGil) {
      nogil.emplace();
    }
    p = reduce(x, n);
    if (floating && !(std::isfinite(p.mn) && std::isfinite(p.mx) && !std::isnan(p.sum))) {
      counts = non_finite(x, n);
    }
  }
  double mn = p.mn, mx = p.mx;
  if (counts.first > 0) {  // a NaN: min and max are NaN, as torch's and numpy's are
    mn = mx = std::numeric_limits<double>::quiet_NaN();
  }
  int64_t checksum = 0;
  if (sums) {
    checksum = sizeof(T) == 8 ? static_cast<int64_t>(p.bits)
                              : static_cast<int64_t>(static_cast<int32_t>(
                                    static_cast<uint32_t>(p.bits)));
  }
  return py::make_tuple(
      py::make_tuple(mn, mx, p.sum / static_cast<double>(n), std::sqrt(p.sumsq), counts.first,
                     counts.second),
      checksum);
}

// Whether t's elements fill one block of memory in some order of its dimensions.
bool dense(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size), size-1 dims left out
  for (int64_t d = 0; d < t.dim(); d++) {
    if (t.size(d) != 1) {
      dims.emplace_back(t.stride(d), t.size(d));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) {
      return false;
    }
    expected *= size;
  }
  return true;
}

bool is_fp8(at::ScalarType s) {
  return s == at::kFloat8_e4m3fn || s == at::kFloat8_e5m2 || s == at::kFloat8_e4m3fnuz ||
         s == at::kFloat8_e5m2fnuz;
}

// A tensor on an accelerator: the Python path's reductions, launched from here (one Python
// call instead of ~15: on a GPU the per-call cost, not the kernels, is the dump's time). The
// figures stay on the device as 0-d results stacked into one float64 vector (the statistics
// window fetches a window's vectors at once), the checksum a 0-d integer tensor: what
// `python_tensor_stats` returns there, from the same kernels.
py::object device_stats(at::Tensor t, int64_t n, bool sums) {
  if (!t.is_contiguous() && dense(t)) {
    t = t.as_strided({n}, {1}, t.storage_offset());
  }
  at::Tensor x = t;
  if (t.scalar_type() == at::kBool) {
    x = t.view(at::kByte);
  } else if (is_fp8(t.scalar_type())) {
    x = t.to(at::kFloat);
  }
  auto [mn, mx] = at::aminmax(x);
  at::Tensor total, l2, nans, infs;
  if (at::isFloatingType(x.scalar_type())) {
    const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    total = at::sum(x, acc);
    if (x.scalar_type() == acc && x.is_contiguous()) {
      at::Tensor flat = x.reshape({-1});
      l2 = at::dot(flat, flat).sqrt();
    } else {
      l2 = at::linalg_vector_norm(x, 2, c10::nullopt, false, acc);
    }
    nans = at::isnan(x).sum(at::kDouble);
    infs = at::isinf(x).sum(at::kDouble);
  } else {
    total = at::sum(x, at::kDouble);
    l2 = at::linalg_vector_norm(x.to(at::kDouble), 2);
    nans = at::zeros({}, x.options().dtype(at::kDouble));
    infs = nans.clone();
  }
  at::Tensor floats = at::stack({mn.to(at::kDouble), mx.to(at::kDouble),
                                 total.to(at::kDouble) / static_cast<double>(n),
                                 l2.to(at::kDouble), nans, infs});
  if (!sums) {
    return py::make_tuple(floats, 0);
  }
  at::Tensor b = t.scalar_type() == at::kBool ? t.view(at::kByte) : t;
  const int64_t size = b.element_size();
  const auto bits = size == 1 ? at::kByte : size == 2 ? at::kShort : size == 4 ? at::kInt
                                                                              : at::kLong;
  return py::make_tuple(floats, b.view(bits).sum(size == 8 ? at::kLong : at::kInt));
}

// Whether the tensor's storage still holds every element its view reads (FSDP resizes an
// unsharded parameter's storage to 0 to free it: no read, its figures stay NaN).
bool holds_its_elements(const at::Tensor& t) {
  if (!t.has_storage() || t.storage().data() == nullptr) {
    return false;
  }
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); d++) {
    last += (t.size(d) - 1) * std::abs(t.stride(d));
  }
  return static_cast<uint64_t>(last + 1) * t.element_size() <= t.storage().nbytes();
}

py::object empty_stats() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return py::make_tuple(py::make_tuple(nan, nan, nan, nan, 0, 0), 0);
}

py::object stats(const at::Tensor& tensor, bool sums) {
  if (!tensor.defined() || tensor.device().type() == c10::DeviceType::Meta ||
      tensor.layout() != c10::Layout::Strided || tensor.is_conj() ||
      tensor.is_complex()) {
    return py::none();
  }
  switch (tensor.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kFloat8_e4m3fn: case at::kFloat8_e5m2: case at::kFloat8_e4m3fnuz:
    case at::kFloat8_e5m2fnuz: case at::kLong: case at::kInt: case at::kShort:
    case at::kChar: case at::kByte: case at::kBool:
      break;
    default:
      return py::none();
  }
  const int64_t n = tensor.numel();
  if (n == 0) {
    return empty_stats();
  }
  // memory the view reads past its storage's end (a storage resized to 0, as FSDP frees an
  // unsharded parameter): an error the loop counts, never a read of freed memory
  if (!holds_its_elements(tensor)) {
    throw py::value_error("the tensor reads past the end of its storage (freed or resized "
                          "memory): no statistics");
  }
  at::Tensor t = tensor;
  if (t.is_neg()) {
    t = t.resolve_neg();  // its bits are not its values
  }
  if (t.device().type() != c10::DeviceType::CPU) {
    return device_stats(t, n, sums);
  }
  if (!t.is_contiguous()) {
    t = dense(t) ? t.as_strided({n}, {1}, t.storage_offset()) : t.contiguous();
  }
  switch (t.scalar_type()) {
    case at::kFloat: return figures<float>(t, n, true, sums);
    case at::kDouble: return figures<double>(t, n, true, sums);
    case at::kHalf: return figures<c10::Half>(t, n, true, sums);
    case at::kBFloat16: return figures<c10::BFloat16>(t, n, true, sums);
    case at::kFloat8_e4m3fn: return figures<c10::Float8_e4m3fn>(t, n, true, sums);
    case at::kFloat8_e5m2: return figures<c10::Float8_e5m2>(t, n, true, sums);
    case at::kFloat8_e4m3fnuz: return figures<c10::Float8_e4m3fnuz>(t, n, true, sums);
    case at::kFloat8_e5m2fnuz: return figures<c10::Float8_e5m2fnuz>(t, n, true, sums);
    case at::kLong: return figures<int64_t>(t, n, false, sums);
    case at::kInt: return figures<int32_t>(t, n, false, sums);
    case at::kShort: return figures<int16_t>(t, n, false, sums);
    case at::kChar: return figures<int8_t>(t, n, false, sums);
    case at::kByte: return figures<uint8_t>(t, n, false, sums);
    case at::kBool: return figures<bool>(t, n, false, sums);
    default: return py::none();
  }
}

// The monitor's figures of a list of tensors in one call (accuracy/monitor/reductions.py: a
// step's outputs and gradients, most of them small): L2 norm, min and max of each CPU
// fp32/fp64/fp16/bf16 contiguous tensor (`pass` without the dump's sum and checksum: the sum of
// squares in double, min and max exact). Every tensor's elements are cut into fixed 64
// Ki-element chunks, spread over torch's intra-op threads with the GIL released and combined
// in order: the same figures at any thread count, and a step's many small tensors cost one
// call.
Partial norm_of(at::ScalarType dtype, const void* data, int64_t n) {
  switch (dtype) {
    case at::kFloat: return pass<float, false>(static_cast<const float*>(data), n);
    case at::kDouble: return pass<double, false>(static_cast<const double*>(data), n);
    case at::kHalf: return pass<c10::Half, false>(static_cast<const c10::Half*>(data), n);
    default:
      return pass<c10::BFloat16, false>(static_cast<const c10::BFloat16*>(data), n);
  }
}

// (figures, declined): [norm, min, max] of tensor i at 3i (NaN where not measured); declined,
// the indices the caller's torch path takes (another device, dtype or layout, no elements,
// or a value or the sum of squares not finite: that path counts NaN and inf). A tensor whose
// storage was freed is in neither: NaN.
py::tuple norms(const std::vector<at::Tensor>& ts) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t k = static_cast<int64_t>(ts.size());
  std::vector<double> out(3 * k, nan);
  std::vector<int64_t> declined;
  struct Item {
    int64_t tensor, first, n;
  };
  std::vector<Item> items;
  std::vector<int64_t> measured;
  int64_t total = 0;
  for (int64_t i = 0; i < k; i++) {
    const at::Tensor& t = ts[i];
    const auto dt = t.scalar_type();
    if (t.layout() == c10::Layout::Strided && t.numel() > 0 && !holds_its_elements(t)) {
      continue;
    }
    if (!t.is_cpu() || t.layout() != c10::Layout::Strided || t.is_neg() || t.numel() == 0 ||
        !(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16) ||
        !t.is_contiguous()) {
      declined.push_back(i);
      continue;
    }
    const int64_t n = t.numel();
    for (int64_t first = 0; first < n; first += kChunk) {
      items.push_back({i, first, std::min(kChunk, n - first)});
    }
    measured.push_back(i);
    total += n;
  }
  std::vector<Partial> parts(items.size());
  {
    std::optional<py::gil_scoped_release> nogil;
    if (total >= kReleaseGil) {
      nogil.emplace();
    }
    auto body = [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; j++) {
        const Item& it = items[j];
        const at::Tensor& t = ts[it.tensor];
        const char* base = static_cast<const char*>(t.const_data_ptr());
        parts[j] = norm_of(t.scalar_type(), base + it.first * t.element_size(), it.n);
      }
    };
    const int64_t count = static_cast<int64_t>(items.size());
    if (total > 2 * kChunk) {
      at::parallel_for(0, count, 1, body);
    } else {
      body(0, count);
    }
  }
  size_t j = 0;
  for (int64_t i : measured) {
    Partial all;
    for (; j < items.size() && items[j].tensor == i; j++) {
      merge(all, parts[j]);
    }
    if (!(std::isfinite(all.mn) && std::isfinite(all.mx) && std::isfinite(all.sumsq))) {
      declined.push_back(i);
      continue;
    }
    out[3 * i] = std::sqrt(all.sumsq);
    out[3 * i + 1] = all.mn;
    out[3 * i + 2] = all.mx;
  }
  std::sort(declined.begin(), declined.end());
  return py::make_tuple(out, declined);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Statistics of recorded tensors for the statistics dump (accuracy/native)";
  m.def("stats", &stats, py::arg("t"), py::arg("sums") = true,
        "((min, max, mean, l2, nan_count, inf_count), checksum) of a tensor, or None; on a "
        "device the figures a float64 tensor there and the checksum a 0-d tensor");
  m.def("norms", &norms, py::arg("tensors"),
        "([norm, min, max] per tensor, flat, NaN where not measured; the indices declined to "
        "the caller's torch path) of CPU fp32/fp64/fp16/bf16 contiguous tensors");
}
