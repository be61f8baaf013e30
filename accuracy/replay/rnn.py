"""Reference implementations of the RNN kernels, in plain ATen ops.

oneDNN's `mkldnn_rnn_layer` (what `nn.LSTM` runs on CPU) has no fp64 kernel ("get_mkldnn_dtype:
unsupported data type"), so replay's upcast run would fail and the LSTM's local error would go
unjudged. These functions recompute a layer (and its backward, through autograd) with matmuls
and pointwise ops, which run in any dtype: the same-dtype run keeps the native kernel when it
has one (its error is the one a device kernel should match), the fp64 run uses the recompute.
CUDA's fused LSTM and GRU cells (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell` and their
backwards), which have no CPU kernel, get one here too (their workspaces laid out as CUDA's
kernels keep them, which the backwards read), so a CUDA dump replays on CPU and the live check
judges them. The oneDNN workspace output
(`aten.WORKSPACE_OUTPUTS`) is scratch memory: the reference returns an
empty placeholder there and replay never measures it.

They are registered as built-in references (`replay.registry`), so a user's own registration
for the same op still wins.
"""

from __future__ import annotations

from typing import Any

import torch

from accuracy.aten import resolve_op
from accuracy.replay.registry import register_builtin_reference

# mkldnn_rnn_layer's `mode` (oneDNN's algorithm kinds as ATen numbers them)
_RNN_RELU, _RNN_TANH, _LSTM, _GRU = 0, 1, 2, 3


def lstm_cell(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_ih: torch.Tensor,
              w_hh: torch.Tensor, b_ih: torch.Tensor | None,
              b_hh: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step, gates in PyTorch's order (input, forget, cell, output)."""
    gates = x @ w_ih.t() + h @ w_hh.t()
    if b_ih is not None:
        gates = gates + b_ih
    if b_hh is not None:
        gates = gates + b_hh
    i, f, g, o = gates.chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def lstm_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
               b_ih: torch.Tensor | None, b_hh: torch.Tensor | None, hx: torch.Tensor,
               cx: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                         torch.Tensor]:
    """One time-major LSTM layer: (output (T, B, H), h_T, c_T)."""
    h, c = hx, cx
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    outs: list[torch.Tensor] = [x.new_empty(0)] * x.shape[0]
    for t in steps:
        h, c = lstm_cell(x[t], h, c, w_ih, w_hh, b_ih, b_hh)
        outs[t] = h
    return torch.stack(outs), h, c


def _check_layer(mode: int, batch_sizes: Any) -> None:
    if mode != _LSTM:
        raise NotImplementedError(f"mkldnn_rnn_layer reference covers LSTM (mode 2), not {mode}")
    if batch_sizes:
        raise NotImplementedError("mkldnn_rnn_layer reference: packed sequences not covered")


def mkldnn_rnn_layer(input: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                     w3: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor, reverse: bool,
                     batch_sizes: Any, mode: int, hidden_size: int, num_layers: int,
                     has_biases: bool, bidirectional: bool, batch_first: bool,
                     train: bool) -> tuple[torch.Tensor, ...]:
    """`aten.mkldnn_rnn_layer`: the native kernel where it has this dtype, else the recompute
    (output, hy, cy, an empty workspace)."""
    if input.dtype != torch.float64:
        native = resolve_op("aten.mkldnn_rnn_layer.default")
        if native is not None:
            return native(input, w0, w1, w2, w3, hx, cx, reverse, batch_sizes, mode,
                          hidden_size, num_layers, has_biases, bidirectional, batch_first,
                          train)
    _check_layer(mode, batch_sizes)
    out, hy, cy = lstm_layer(input, w0, w1, w2 if has_biases else None,
                             w3 if has_biases else None, hx, cx, reverse)
    return out, hy, cy, torch.empty(0, dtype=torch.uint8, device=input.device)


def mkldnn_rnn_layer_backward(input: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                              w3: torch.Tensor, w4: torch.Tensor, hx: torch.Tensor,
                              cx: torch.Tensor, output: torch.Tensor, hy: torch.Tensor,
                              cy: torch.Tensor, grad_output: torch.Tensor | None,
                              grad_hy: torch.Tensor | None, grad_cy: torch.Tensor | None,
                              reverse: bool, mode: int, hidden_size: int, num_layers: int,
                              has_biases: bool, train: bool, bidirectional: bool,
                              batch_sizes: Any, batch_first: bool,
                              workspace: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`aten.mkldnn_rnn_layer_backward`: the native kernel (with the recorded workspace) where
    it has this dtype, else the forward recomputed under autograd and differentiated."""
    if input.dtype != torch.float64 and workspace.numel():
        native = resolve_op("aten.mkldnn_rnn_layer_backward.default")
        if native is not None:
            return native(input, w1, w2, w3, w4, hx, cx, output, hy, cy, grad_output,
                          grad_hy, grad_cy, reverse, mode, hidden_size, num_layers,
                          has_biases, train, bidirectional, batch_sizes, batch_first,
                          workspace)
    _check_layer(mode, batch_sizes)
    leaves = [t.detach().requires_grad_(True) for t in (input, w1, w2, w3, w4, hx, cx)]
    with torch.enable_grad():
        x, wi, wh, bi, bh, h0, c0 = leaves
        out, h, c = lstm_layer(x, wi, wh, bi if has_biases else None,
                               bh if has_biases else None, h0, c0, reverse)
        pairs = [(t, g) for t, g in ((out, grad_output), (h, grad_hy), (c, grad_cy))
                 if g is not None]
        grads = torch.autograd.grad([t for t, _ in pairs], leaves,
                                    [g.to(t.dtype) for t, g in pairs], allow_unused=True)
    return tuple(torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads,
                                                                               strict=True))


def thnn_fused_lstm_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor,
                         cx: torch.Tensor, input_bias: torch.Tensor | None = None,
                         hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """`aten._thnn_fused_lstm_cell` (CUDA's fused LSTM cell; no CPU kernel): (hy, cy, the
    activated gates it keeps for backward: sigmoid i, sigmoid f, tanh g, sigmoid o)."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, -1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    return o * torch.tanh(cy), cy, torch.cat([i, f, g, o], -1)


def thnn_fused_lstm_cell_backward_impl(grad_hy: torch.Tensor | None,
                                       grad_cy: torch.Tensor | None, cx: torch.Tensor,
                                       cy: torch.Tensor, workspace: torch.Tensor,
                                       has_bias: bool) -> tuple[torch.Tensor | None, ...]:
    """`aten._thnn_fused_lstm_cell_backward_impl`: (grad of the pre-activation gates,
    grad_cx, grad_bias), from the activated gates in `workspace`."""
    i, f, g, o = workspace.chunk(4, -1)
    tanh_cy = torch.tanh(cy)
    ghy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    gcy = (torch.zeros_like(cy) if grad_cy is None else grad_cy) + ghy * o * (1 - tanh_cy ** 2)
    grad_gates = torch.cat([gcy * g * i * (1 - i), gcy * cx * f * (1 - f),
                            gcy * i * (1 - g ** 2), ghy * tanh_cy * o * (1 - o)], -1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, gcy * f, grad_bias


def thnn_fused_gru_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
                        input_bias: torch.Tensor | None = None,
                        hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """`aten._thnn_fused_gru_cell` (CUDA's fused GRU cell; no CPU kernel): (hy, the workspace
    its backward reads, laid out as CUDA's kernel keeps it: r, z, n, hx and the hidden n-gate
    with its bias)."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, i_n = input_gates.chunk(3, -1)
    hr, hz, hn = hidden_gates.chunk(3, -1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(i_n + r * hn)
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], -1)


def thnn_fused_gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor,
                                 has_bias: bool) -> tuple[torch.Tensor | None, ...]:
    """`aten._thnn_fused_gru_cell_backward`: (grad of the input gates, of the hidden gates,
    grad_hx, and the two biases' grads), from `thnn_fused_gru_cell`'s workspace."""
    r, z, n, hx, hn = workspace.chunk(5, -1)
    gz = grad_hy * (hx - n) * z * (1 - z)
    gn = grad_hy * (1 - z) * (1 - n * n)
    gr = gn * hn * r * (1 - r)
    grad_input = torch.cat([gr, gz, gn], -1)
    grad_hidden = torch.cat([gr, gz, gn * r], -1)
    if not has_bias:
        return grad_input, grad_hidden, grad_hy * z, None, None
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)


register_builtin_reference("aten.mkldnn_rnn_layer.default", mkldnn_rnn_layer)
register_builtin_reference("aten._thnn_fused_lstm_cell.default", thnn_fused_lstm_cell)
register_builtin_reference("aten._thnn_fused_lstm_cell_backward_impl.default",
                           thnn_fused_lstm_cell_backward_impl)
register_builtin_reference("aten.mkldnn_rnn_layer_backward.default", mkldnn_rnn_layer_backward)
register_builtin_reference("aten._thnn_fused_gru_cell.default", thnn_fused_gru_cell)
register_builtin_reference("aten._thnn_fused_gru_cell_backward.default",
                           thnn_fused_gru_cell_backward)
