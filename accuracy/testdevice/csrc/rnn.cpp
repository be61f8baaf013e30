// The fused LSTM and GRU cells: ATen's RNNs call them on every device but the CPU (as on CUDA)
// and CPU has no kernel for them, so the device composes them of ops it runs (queued, like any
// other). The gates are summed in the order CUDA's fused kernels use (input gates + hidden
// gates + input bias + hidden bias), so the results differ from CPU's unfused cells by
// rounding only, as a real device's do.
#include "npu.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace accuracy_npu {
namespace {

c10::impl::ExcludeDispatchKeyGuard internal_ops() {
  return c10::impl::ExcludeDispatchKeyGuard(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
}

at::Tensor summed(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                  const std::optional<at::Tensor>& input_bias,
                  const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = input_gates + hidden_gates;
  if (input_bias.has_value() && input_bias->defined()) gates = gates + *input_bias;
  if (hidden_bias.has_value() && hidden_bias->defined()) gates = gates + *hidden_bias;
  return gates;
}

at::Tensor or_zeros(const std::optional<at::Tensor>& t, const at::Tensor& like) {
  return t.has_value() && t->defined() ? *t : at::zeros_like(like);
}

// workspace = [i, f, g, o] after their activations.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  auto no_python = internal_ops();
  auto gates = summed(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1);
  at::Tensor i = gates[0].sigmoid(), f = gates[1].sigmoid(), g = gates[2].tanh(),
             o = gates[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  auto no_python = internal_ops();
  if (!(grad_hy.has_value() && grad_hy->defined()) && !(grad_cy.has_value() && grad_cy->defined()))
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  auto w = workspace.chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  at::Tensor ghy = or_zeros(grad_hy, cy), gcy = or_zeros(grad_cy, cy);
  at::Tensor tanh_cy = cy.tanh();
  at::Tensor gc = gcy + ghy * o * (1 - tanh_cy * tanh_cy);
  at::Tensor gi = gc * g * i * (1 - i);
  at::Tensor gf = gc * cx * f * (1 - f);
  at::Tensor gg = gc * i * (1 - g * g);
  at::Tensor go = ghy * tanh_cy * o * (1 - o);
  at::Tensor grad_gates = at::cat({gi, gf, gg, go}, 1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, gc * f, grad_bias};
}

// workspace = [r, z, n, hx, hidden n-gate (with its bias)]: CUDA's kernel's layout.
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates,
                                            const at::Tensor& hidden_gates, const at::Tensor& hx,
                                            const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  auto no_python = internal_ops();
  at::Tensor ig = input_gates, hg = hidden_gates;
  if (input_bias.has_value() && input_bias->defined()) ig = ig + *input_bias;
  if (hidden_bias.has_value() && hidden_bias->defined()) hg = hg + *hidden_bias;
  auto ic = ig.chunk(3, 1);
  auto hc = hg.chunk(3, 1);
  at::Tensor r = (ic[0] + hc[0]).sigmoid();
  at::Tensor z = (ic[1] + hc[1]).sigmoid();
  at::Tensor n = (ic[2] + r * hc[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hc[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto no_python = internal_ops();
  auto w = workspace.chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  at::Tensor gz = grad_hy * (hx - n) * z * (1 - z);
  at::Tensor gn = grad_hy * (1 - z) * (1 - n * n);
  at::Tensor gr = gn * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({gr, gz, gn}, 1);
  at::Tensor grad_hidden_gates = at::cat({gr, gz, gn * r}, 1);
  at::Tensor grad_hx = grad_hy * z;
  at::Tensor gib = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor ghb = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, gib, ghb};
}

}  // namespace
}  // namespace accuracy_npu

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(accuracy_npu::lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(accuracy_npu::lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(accuracy_npu::gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(accuracy_npu::gru_cell_backward));
}
