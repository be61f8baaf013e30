// The Python face of the npu test device (imported as accuracy.testdevice's `_C`).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Stream.h>
#include <torch/extension.h>

#include "npu.h"

namespace py = pybind11;
using namespace accuracy_npu;

namespace {

py::dict memory_dict(int index) {
  MemoryStats s = memory_stats(c10::DeviceIndex(index));
  py::dict d;
  d["allocated"] = s.allocated;
  d["peak"] = s.peak;
  d["reserved"] = s.reserved;
  d["total"] = s.total;
  return d;
}

py::dict counters_dict() {
  Counters& c = counters();
  py::dict d;
  d["d2h_copies"] = c.d2h_copies.load();
  d["d2h_bytes"] = c.d2h_bytes.load();
  d["d2h_nonblocking"] = c.d2h_nonblocking.load();
  d["h2d_copies"] = c.h2d_copies.load();
  d["h2d_bytes"] = c.h2d_bytes.load();
  d["h2d_nonblocking"] = c.h2d_nonblocking.load();
  d["d2d_copies"] = c.d2d_copies.load();
  d["d2d_bytes"] = c.d2d_bytes.load();
  d["syncs_explicit"] = c.syncs_explicit.load();
  d["syncs_implicit"] = c.syncs_implicit.load();
  d["kernels_queued"] = c.kernels_queued.load();
  d["kernels_sync"] = c.kernels_sync.load();
  d["kernels_failed"] = c.kernels_failed.load();
  py::dict reasons;
  for (const auto& [k, v] : sync_reasons()) reasons[py::str(k)] = v;
  d["sync_reasons"] = reasons;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "npu test device (accuracy.testdevice)";
  m.def("register_hooks", &register_hooks);
  m.def("device_count", [] { return int(kDeviceCount); });
  m.def("current_device", [] { return int(current_device()); });
  m.def("set_device", [](int i) { set_current_device(c10::DeviceIndex(i)); });
  m.def("synchronize", [](int i) { drain(check_index(c10::DeviceIndex(i)), "torch.npu.synchronize", true); },
        py::call_guard<py::gil_scoped_release>());
  m.def("default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(THPGenerator_Wrap(default_generator(c10::DeviceIndex(i))));
  });
  m.def("current_stream", [](int i) {
    auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    c10::Stream s = impl->getStream(c10::Device(c10::DeviceType::PrivateUse1, check_index(c10::DeviceIndex(i))));
    return py::reinterpret_steal<py::object>(THPStream_Wrap(s));
  });
  m.def("memory_stats", &memory_dict);
  m.def("reset_peak", [](int i) { reset_peak(c10::DeviceIndex(i)); });
  m.def("pinned_bytes", &pinned_bytes);
  m.def("counters", &counters_dict);
  m.def("reset_counters", &reset_counters);
  m.def("set_blocking", &set_blocking);
  m.def("blocking", &blocking);
  m.def("shutdown", &shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("in_bad_fork", &in_bad_fork);
  // Test hooks.
  m.def("set_paused", [](int i, bool p) { set_paused(c10::DeviceIndex(i), p); });
  m.def("set_delay_us", [](int i, int64_t us) { set_delay_us(c10::DeviceIndex(i), us); });
  m.def("peek", [](const at::Tensor& t) { return host_alias(t).clone(); },
        py::call_guard<py::gil_scoped_release>());
}
