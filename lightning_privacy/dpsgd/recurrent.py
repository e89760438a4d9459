"""``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` unrolled over time in plain tensor operations, for the per-example passes.

torch's fused recurrent kernels have no batching rule that ``vmap`` can use everywhere: on the CPU the native kernel
(``nn.GRU`` and ``nn.RNN`` in any precision, ``nn.LSTM`` outside float32's oneDNN path) writes in place into a tensor
the examples share, and cuDNN's kernel is not batched at all. Inside a per-example pass
(:func:`~lightning_privacy.dpsgd.functional.logging_suppressed`) each such layer runs :func:`unrolled` instead: the
same equations as torch's documentation gives them (the same weights, read from the layer so that ``functional_call``'s
swapped parameters are the ones differentiated), one matrix product per time step, which ``vmap`` batches. The result
equals the fused kernel's up to rounding (tests compare both, and a per-example loop in float64).

What it does not unroll goes to the fused kernel as before (and, under ``vmap``, to the loop over examples that
:class:`~lightning_privacy.dpsgd.functional.FunctionalClipping` names in its warning): a ``PackedSequence`` input,
whose packing reads each example's length as data.
"""

from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

__all__ = ["UNROLLED", "unrolled"]

UNROLLED = (nn.RNN, nn.GRU, nn.LSTM)  # exactly these classes (a subclass may change the equations: left as it is)


def unrolled(rnn: nn.RNNBase) -> Callable[..., Any]:
    """A ``forward`` for ``rnn`` (an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM``) computing what its own does, unrolled.

    Example:
        >>> rnn = nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True).double()
        >>> x = torch.randn(2, 5, 3, dtype=torch.float64)
        >>> out, h = unrolled(rnn)(x)
        >>> ref_out, ref_h = rnn(x)
        >>> bool(torch.allclose(out, ref_out) and torch.allclose(h, ref_h))
        True
    """
    if type(rnn) not in UNROLLED:
        raise TypeError(f"unrolled() takes an nn.RNN, nn.GRU or nn.LSTM, not a {type(rnn).__name__}")
    native = type(rnn).forward

    def forward(input: Any, hx: Any = None) -> Any:
        if isinstance(input, PackedSequence):
            return native(rnn, input, hx)
        return _forward(rnn, input, hx)

    return forward


def _forward(rnn: nn.RNNBase, x: torch.Tensor, hx: Any) -> Tuple[torch.Tensor, Any]:
    lstm = isinstance(rnn, nn.LSTM)
    directions = 2 if rnn.bidirectional else 1
    batched = x.dim() == 3
    if not batched:  # one sequence [T, F] (its states [layers·directions, H])
        x = x.unsqueeze(1)
        hx = None if hx is None else tuple(h.unsqueeze(1) for h in hx) if lstm else hx.unsqueeze(1)
    elif rnn.batch_first:
        x = x.transpose(0, 1)  # time first inside: [T, B, F]
    B = x.shape[1]
    out_size = rnn.proj_size if getattr(rnn, "proj_size", 0) > 0 else rnn.hidden_size
    if hx is None:
        h0 = x.new_zeros(rnn.num_layers * directions, B, out_size)
        c0 = x.new_zeros(rnn.num_layers * directions, B, rnn.hidden_size) if lstm else None
    else:
        h0, c0 = hx if lstm else (hx, None)
    finals_h: List[torch.Tensor] = []
    finals_c: List[torch.Tensor] = []
    for layer in range(rnn.num_layers):
        outputs = []
        for direction in range(directions):
            k = layer * directions + direction
            weights = [getattr(rnn, name) for name in rnn._all_weights[k]]
            c = c0[k] if lstm else None
            seq, h, c = _direction(rnn, x, weights, h0[k], c, reverse=direction == 1)
            outputs.append(seq)
            finals_h.append(h)
            if lstm:
                finals_c.append(c)
        x = outputs[0] if directions == 1 else torch.cat(outputs, dim=2)
        if rnn.dropout > 0 and rnn.training and layer < rnn.num_layers - 1:
            x = F.dropout(x, p=rnn.dropout, training=True)
    h_n = torch.stack(finals_h)
    state: Any = (h_n, torch.stack(finals_c)) if lstm else h_n
    if not batched:
        x = x.squeeze(1)
        state = tuple(s.squeeze(1) for s in state) if lstm else state.squeeze(1)
    elif rnn.batch_first:
        x = x.transpose(0, 1)
    return x, state


def _direction(
    rnn: nn.RNNBase,
    x: torch.Tensor,
    weights: List[torch.Tensor],
    h: torch.Tensor,
    c: Optional[torch.Tensor],
    reverse: bool,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """One layer in one direction over ``x`` [T, B, F]: its outputs [T, B, H], last ``h`` and (LSTM) ``c``."""
    w_ih, w_hh = weights[0], weights[1]
    b_ih, b_hh = (weights[2], weights[3]) if rnn.bias else (None, None)
    w_hr = weights[-1] if getattr(rnn, "proj_size", 0) > 0 else None
    inputs = F.linear(x, w_ih, b_ih)  # every time step's input part at once: [T, B, gates·H]
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    outputs: List[torch.Tensor] = [x.new_empty(0)] * x.shape[0]
    for t in steps:
        hidden = F.linear(h, w_hh, b_hh)
        if isinstance(rnn, nn.LSTM):
            i, f, g, o = (inputs[t] + hidden).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            if w_hr is not None:
                h = F.linear(h, w_hr)
        elif isinstance(rnn, nn.GRU):
            i_r, i_z, i_n = inputs[t].chunk(3, dim=-1)
            h_r, h_z, h_n = hidden.chunk(3, dim=-1)
            r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
            n = torch.tanh(i_n + r * h_n)
            h = (1 - z) * n + z * h
        else:
            pre = inputs[t] + hidden
            h = torch.tanh(pre) if rnn.nonlinearity == "tanh" else torch.relu(pre)
        outputs[t] = h
    return torch.stack(outputs), h, c
