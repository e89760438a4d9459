"""Recurrent layers under DP-SGD (issue 57, item 6): ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` unrolled in the per-example
passes (``lightning_privacy.dpsgd.recurrent``) go through vmap in every precision and equal a float64 per-example loop;
a packed sequence goes one example at a time, exactly, and says so; ``nn.RNN`` is refused in hooks mode with its fix
named, and ``fix_modules=True`` gives Opacus' ``DPRNN`` with the same weights; Opacus' ``DPLSTM`` on packed sequences
is never trained wrong (the exactness check stops hooks mode, auto switches to functional mode).

References: torch's fused kernels themselves (the unrolled layers), and the float64 loop of
``tests/callbacks/test_dpsgd_functional.py`` (each example's ``training_step`` alone, differentiated by autograd).
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.layers import DPRNN
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from lightning_privacy.checkpoints import fixable_module_names, replace_module
from lightning_privacy.dpsgd.recurrent import unrolled
from tests.callbacks.test_dpsgd_functional import TOLERANCE, D, V, _Base, _data, _trainer, fit_and_compare

F64 = torch.float64


def _configurations():
    for cls, layers, bidirectional, batch_first, bias, proj in itertools.product(
        (nn.RNN, nn.GRU, nn.LSTM), (1, 2), (False, True), (False, True), (False, True), (0, 3)
    ):
        if proj and cls is not nn.LSTM:
            continue
        extra = {"proj_size": proj} if cls is nn.LSTM else {"nonlinearity": "relu"} if cls is nn.RNN and bias else {}
        yield cls, dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias, **extra)


@pytest.mark.parametrize("cls,kwargs", list(_configurations()), ids=lambda v: getattr(v, "__name__", None))
def test_the_unrolled_layer_computes_what_torch_s_fused_kernel_computes_and_the_same_gradients(cls, kwargs):
    torch.manual_seed(0)
    rnn = cls(4, 5, **kwargs).double()
    directions = 2 if kwargs["bidirectional"] else 1
    out_size = kwargs.get("proj_size") or 5
    for batched, given in itertools.product((True, False), (False, True)):
        shape = ((3, 6, 4) if kwargs["batch_first"] else (6, 3, 4)) if batched else (6, 4)
        x = torch.randn(*shape, dtype=F64, requires_grad=True)
        states = (kwargs["num_layers"] * directions, *((3,) if batched else ()))
        hx = None
        if given:
            hx = torch.randn(*states, out_size, dtype=F64)
            hx = (hx, torch.randn(*states, 5, dtype=F64)) if cls is nn.LSTM else hx
        ours, theirs = unrolled(rnn)(x, hx), rnn(x, hx)
        flat = [t for pair in (ours, theirs) for t in (pair[0], *(pair[1] if cls is nn.LSTM else (pair[1],)))]
        half = len(flat) // 2
        for a, b in zip(flat[:half], flat[half:]):
            assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12), (batched, given)
        weights = [x, *rnn.parameters()]
        mine = torch.autograd.grad(sum(t.sin().sum() for t in flat[:half]), weights)
        reference = torch.autograd.grad(sum(t.sin().sum() for t in flat[half:]), weights)
        assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(mine, reference))


def test_a_subclass_is_left_to_its_own_forward_and_anything_else_is_refused_by_name():
    with pytest.raises(TypeError, match="not a DPRNN"):
        unrolled(DPRNN(4, 5))


class Recurrent(_Base):
    """Embedding → a two-layer bidirectional recurrent layer → head on its last output and its last state."""

    def __init__(self, cls=nn.GRU, packed=False, **kwargs):
        super().__init__()
        self.packed = packed
        self.embed = nn.Embedding(V, D)
        self.rnn = cls(D, D, num_layers=2, bidirectional=True, batch_first=True, **kwargs)
        self.head = nn.Linear(3 * D, 2)

    def forward(self, ids):
        x = self.embed(ids)
        if self.packed:  # each row's length read from its tokens (at least one)
            lengths = (ids != 0).sum(1).clamp(min=1)
            out, state = self.rnn(pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False))
            h = state[0] if isinstance(state, tuple) else state
            return self.head(torch.cat([h[-1], h[-2], h[-3]], dim=1))
        out, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state
        return self.head(torch.cat([out[:, -1], h[-1]], dim=1))


@pytest.mark.parametrize(
    "cls,kwargs",
    [(nn.GRU, {}), (nn.RNN, {"nonlinearity": "relu"}), (nn.RNN, {}), (nn.LSTM, {}), (nn.LSTM, {"proj_size": 4})],
    ids=["GRU", "RNN-relu", "RNN-tanh", "LSTM", "LSTM-proj"],
)
def test_recurrent_layers_go_through_vmap_in_float64_and_equal_the_per_example_loop(cls, kwargs):
    if kwargs.get("proj_size"):  # (the head reads 2·proj + ... : size it to the projected state)
        make = lambda: _Projected(cls, **kwargs)  # noqa: E731
    else:
        make = lambda: Recurrent(cls, **kwargs)  # noqa: E731
    for mode in ("functional", "auto"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no fallback to the loop, no other warning of ours
            warnings.filterwarnings("ignore", message=".*(does not have many workers|sampling_seed|noise_seed).*")
            dpsgd, difference, _ = fit_and_compare(make, mode=mode)
        assert difference < TOLERANCE, (mode, difference)
        assert dpsgd.grad_sample_mode == "functional" and dpsgd.exactness.reference.endswith("(vmap)")


class _Projected(Recurrent):
    def __init__(self, cls, **kwargs):
        super().__init__(cls, **kwargs)
        self.head = nn.Linear(2 * kwargs["proj_size"] + kwargs["proj_size"], 2)


def test_packed_sequences_go_one_example_at_a_time_exactly_and_say_so():
    with pytest.warns(UserWarning, match=r"a `PackedSequence` \(at test_dpsgd_recurrent.py:\d+\).*own forward"):
        dpsgd, difference, _ = fit_and_compare(lambda: Recurrent(nn.LSTM, packed=True))
    assert difference < TOLERANCE and dpsgd.exactness.reference.endswith("(loop)")


def test_an_rnn_is_refused_in_hooks_mode_naming_dprnn_and_fix_modules_trains_it_exactly_with_its_weights():
    for mode in ("hooks", "ghost"):
        with pytest.raises(MisconfigurationException, match=r"RNN → DPRNN: rnn\..*fused implementation"):
            _trainer([DPSGD(noise_multiplier=1.0, grad_sample_mode=mode)]).fit(
                Recurrent(nn.RNN).double(), DataLoader(_data(), batch_size=16)
            )
    model = Recurrent(nn.RNN, nonlinearity="relu").double()
    original = model.rnn
    assert fixable_module_names(model) == ["rnn"]
    fixed = replace_module(model, "rnn")
    x = torch.randn(3, 5, D, dtype=F64)
    assert isinstance(fixed, DPRNN) and fixed.weight_hh_l1_reverse.dtype == F64
    assert all(torch.equal(a, b) for a, b in zip(fixed(x), original(x)))  # same weights, relu kept
    model = Recurrent(nn.RNN).double()
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode="hooks", fix_modules=True)
    with pytest.warns(UserWarning, match=r"rnn \(RNN → DPRNN\)"):
        _trainer([dpsgd]).fit(model, DataLoader(_data(), batch_size=16))
    assert isinstance(model.rnn, DPRNN) and dpsgd.steps == 3

    def fixed():  # (the float64 loop's twin must hold the same layers)
        model = Recurrent(nn.RNN)
        replace_module(model, "rnn")
        return model

    dpsgd, difference, _ = fit_and_compare(fixed, mode="hooks")
    assert difference < TOLERANCE and dpsgd.grad_sample_mode == "hooks"


def test_opacus_dplstm_on_packed_sequences_is_never_trained_wrong():
    """Opacus' DPLSTM gives packed sequences per-example gradients far from the examples' own (measured: 76 % of the
    norm, ``benchmarks/results/recurrent_cost.md``): hooks mode's exactness check stops the fit before the first noised
    update, and auto switches that step to functional mode. (float32: DPLSTM's packed path builds its initial state
    in float32 and fails raw in float64.)"""
    for mode in ("hooks", "auto"):
        torch.manual_seed(0)
        dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, fix_modules=True, sampling_seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if mode == "hooks":
                with pytest.raises(MisconfigurationException, match="exactness check.*rnn\\."):
                    _trainer([dpsgd]).fit(Recurrent(nn.LSTM, packed=True), DataLoader(_data(), batch_size=16))
                assert dpsgd.steps == 0
                continue
            _trainer([dpsgd]).fit(Recurrent(nn.LSTM, packed=True), DataLoader(_data(), batch_size=16))
        assert dpsgd.grad_sample_mode == "functional" and dpsgd.steps == 3
        assert any("switch" in str(w.message) for w in caught)
