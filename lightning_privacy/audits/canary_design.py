"""Input canaries optimised for a one-run audit by metagradient descent.

Boglioni, Liu, Ilyas, Wu, "Optimizing Canaries for Privacy Auditing with Metagradient Descent" (arXiv 2507.15836,
ICLR 2026). The one-run audit's black-box canaries (:class:`~lightning_privacy.CanaryAudit` with ``kind="input"``)
are by default training rows with a wrong label; the final model barely tells the included ones from the others, so
their bound stays far below the accountant's ε. The paper treats the canaries' inputs as parameters: train a proxy
model on the data plus a random half of the canaries, measure how much lower the included canaries' loss is than
the excluded ones', and follow the gradient of that gap through the whole training run (the metagradient) back to
the canaries' inputs. Canaries optimised on a cheap non-private proxy transfer to the DP-SGD run being audited.

:func:`optimize_input_canaries` does this by differentiating through an unrolled run of plain SGD or Adam
(``torch.func.functional_call``): the whole graph of ``steps`` steps is kept in memory, which suits the small models
this is meant for (the paper's REPLAY algorithm is what makes metagradients affordable for large ones; it is not
built here). The details are this implementation's, not taken from the paper: every meta-step trains a freshly
initialised proxy on a fresh random half of the canaries; the objective is the gap between the excluded and the
included canaries' mean membership loss (the audit's own score); Adam moves the inputs, the labels stay fixed; the
proxy samples its batches like DP-SGD (Poisson, rate ``sample_rate``, the sum divided by the expected batch size),
without clipping or noise; and the inputs stay inside the training data's per-feature range (``bounds="data"``), so a
canary cannot win on the proxy by a gradient norm that DP-SGD's clipping would take away. Measured on the Adult MLP
(``benchmarks/results/input_canary_design.md``): 2.6–6.0× the bounds of the starting rows where the model memorises
without DP-SGD, nothing under DP-SGD.

**Soundness.** The audit stays valid whatever the canaries are, as long as they are fixed before the audited run and
its inclusion bits are drawn independently of them: :class:`~lightning_privacy.CanaryAudit` draws inclusion from its
own ``seed`` (numpy), never seen by the design (torch generators from this function's ``seed``).

Example::

    >>> import torch
    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> data = TensorDataset(torch.randn(200, 5), torch.randint(0, 2, (200,)))
    >>> design = optimize_input_canaries(nn.Linear(5, 2), data, num_canaries=10, sample_rate=0.1, steps=5, lr=0.5,
    ...                                  meta_steps=3)
    >>> len(design.examples), len(design.objective)
    (10, 3)
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_privacy.functional.membership_loss import membership_loss

__all__ = ["CanaryDesign", "optimize_input_canaries"]

_START, _META = 0, 1  # streams of the design's seed: the starting rows and labels; the meta-steps


@dataclasses.dataclass
class CanaryDesign:
    """The optimised canaries and how the optimisation went.

    Attributes:
        examples: the m optimised canaries, ``TensorDataset(inputs, labels)``: pass it as
            ``CanaryAudit("input", examples=design.examples)``.
        initial: the m starting canaries (wrong-label copies of random training rows), the same labels.
        objective: the objective of every meta-step: the excluded canaries' mean membership loss minus the included
            ones' on that step's proxy (higher = the proxy tells them apart better).
        rows: the training rows the canaries started from.
    """

    examples: TensorDataset
    initial: TensorDataset
    objective: List[float]
    rows: List[int]


def _tensors(dataset: Dataset) -> Tuple[Tensor, Tensor]:
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        x, y = dataset.tensors[0], dataset.tensors[1]
    else:
        x, y = next(iter(DataLoader(dataset, batch_size=len(dataset))))[:2]
    if not torch.is_floating_point(x) or y.dim() != 1 or torch.is_floating_point(y):
        raise ValueError(
            "optimize_input_canaries needs (x, y) examples with floating-point inputs and one integer class label "
            f"each, got inputs of dtype {x.dtype} and labels of shape {tuple(y.shape)}, dtype {y.dtype}"
        )
    return x, y


def _check(num_canaries: Any, n: int, sample_rate: Any, steps: Any, lr: Any, meta_steps: Any, meta_lr: Any) -> None:
    def positive(name: str, value: Any, integer: bool) -> None:
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
            raise ValueError(f"`{name}` must be a positive {'int' if integer else 'number'}, got {value!r}")

    positive("num_canaries", num_canaries, True)
    if num_canaries > n:
        raise ValueError(f"`num_canaries`={num_canaries} needs as many training rows to start from; the data has {n}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0 < sample_rate <= 1:
        raise ValueError(f"`sample_rate` must be in (0, 1], got {sample_rate!r}")
    for name, value, integer in (("steps", steps, True), ("lr", lr, False), ("meta_steps", meta_steps, True)):
        positive(name, value, integer)
    positive("meta_lr", meta_lr, False)


def _bounds(bounds: Union[str, None, Sequence[Any]], x: Tensor) -> Optional[Tuple[Tensor, Tensor]]:
    if bounds is None:
        return None
    if isinstance(bounds, str):
        if bounds != "data":
            raise ValueError(f"`bounds` must be 'data', None or (low, high), got {bounds!r}")
        return x.min(0).values, x.max(0).values
    low, high = (torch.as_tensor(b, dtype=x.dtype).expand(x.shape[1:]) for b in bounds)
    if not bool((low <= high).all()):
        raise ValueError(f"`bounds` must have low <= high everywhere, got {bounds!r}")
    return low, high


def _fresh(model: nn.Module, generator_seed: int) -> dict:
    """The proxy's parameters, re-initialised (``reset_parameters`` of every submodule that has one) from a seed."""
    proxy = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(generator_seed)
        for module in proxy.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return {k: v.detach().clone().requires_grad_(True) for k, v in proxy.named_parameters() if v.requires_grad}


def _train(model, params, x, y, z, labels, included, sample_rate, steps, lr, generator, create_graph, adam=False):
    """``steps`` of plain SGD (or Adam) on Poisson batches of the data and the included canaries (differentiable in
    ``z``)."""
    z_in, labels_in = z[included], labels[included]
    expected = sample_rate * (len(x) + len(z_in))
    moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in params.items()} if adam else {}
    for step in range(1, steps + 1):
        rows = torch.rand(len(x), generator=generator) < sample_rate
        mine = torch.rand(len(z_in), generator=generator) < sample_rate
        batch_x, batch_y = torch.cat([x[rows], z_in[mine]]), torch.cat([y[rows], labels_in[mine]])
        loss = F.cross_entropy(functional_call(model, params, (batch_x,)), batch_y, reduction="sum") / expected
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph, allow_unused=True)
        grads = [torch.zeros_like(v) if g is None else g for v, g in zip(params.values(), grads)]
        if adam:  # torch's Adam (β = 0.9, 0.999) with ε inside the root: √(v̂ + ε²) is differentiable at v̂ = 0
            moments = {
                k: (0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g) for (k, (m, v)), g in zip(moments.items(), grads)
            }
            grads = [(m / (1 - 0.9**step)) / torch.sqrt(v / (1 - 0.999**step) + 1e-16) for m, v in moments.values()]
        params = {k: v - lr * g for (k, v), g in zip(params.items(), grads)}
    return params


def optimize_input_canaries(
    model: nn.Module,
    dataset: Dataset,
    num_canaries: int = 1000,
    *,
    sample_rate: float,
    steps: int,
    lr: float,
    meta_steps: int = 60,
    meta_lr: float = 0.3,
    num_classes: Optional[int] = None,
    bounds: Union[str, None, Sequence[Any]] = "data",
    optimizer: str = "sgd",
    seed: int = 0,
    verbose: bool = False,
) -> CanaryDesign:
    """Input canaries for :class:`~lightning_privacy.CanaryAudit` optimised by metagradient descent (module doc).

    Args:
        model: the classifier to audit (or a smaller proxy of it): ``model(x)`` gives ``(N, K)`` logits; only its
            architecture is used (a copy, re-initialised by ``reset_parameters`` at every meta-step).
        dataset: the training data, ``(x, y)`` examples with floating-point inputs and integer labels.
        num_canaries: m, at most the number of rows (each starts as a training row with a wrong label).
        sample_rate, steps, lr: the proxy's training: Poisson batches at this rate, this many steps at this learning
            rate (use the audited run's; fewer steps make each meta-step cheaper).
        meta_steps, meta_lr: Adam steps on the canaries' inputs, and its learning rate.
        num_classes: K for the wrong labels (default: the model's number of logits).
        bounds: ``"data"`` (each input feature within the training data's range), ``None`` (unconstrained) or
            ``(low, high)``, scalars or per-feature tensors.
        optimizer: the proxy's, ``"sgd"`` (plain) or ``"adam"`` (β = 0.9, 0.999; ε = 1e-8 inside the square root).
        seed: the starting rows, wrong labels, proxy initialisations, batches and halves derive from it.
        verbose: print the objective of every meta-step.

    Returns:
        A :class:`CanaryDesign` (``design.examples`` for ``CanaryAudit("input", examples=...)``).

    Raises:
        ValueError: a bad argument (naming it), or data that are not ``(float inputs, int labels)``.
    """
    x, y = _tensors(dataset)
    _check(num_canaries, len(x), sample_rate, steps, lr, meta_steps, meta_lr)
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"`optimizer` must be 'sgd' or 'adam', got {optimizer!r}")
    box = _bounds(bounds, x)
    start = torch.Generator().manual_seed(seed * 3 + _START)
    rows = torch.randperm(len(x), generator=start)[:num_canaries]
    with torch.no_grad():
        k = num_classes or int(model(x[:1]).shape[-1])
    if k < 2 or int(y.max()) >= k:
        raise ValueError(f"`num_classes` must be >= 2 and above every label (max {int(y.max())}), got {k}")
    labels = (y[rows] + 1 + torch.randint(0, k - 1, (num_canaries,), generator=start)) % k
    initial = x[rows].detach().clone()
    z = initial.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([z], lr=meta_lr)
    meta = torch.Generator().manual_seed(seed * 3 + _META)
    objective: List[float] = []
    for step in range(meta_steps):
        included = torch.rand(num_canaries, generator=meta) < 0.5
        params = _fresh(model, int(torch.randint(0, 2**62, (1,), generator=meta)))
        params = _train(
            model, params, x, y, z, labels, included, sample_rate, steps, lr, meta, True, optimizer == "adam"
        )
        losses = membership_loss(functional_call(model, params, (z,)), labels)
        gap = losses[~included].mean() - losses[included].mean()
        optimizer.zero_grad()
        (-gap).backward()
        optimizer.step()
        if box is not None:
            with torch.no_grad():
                z.copy_(torch.maximum(torch.minimum(z, box[1]), box[0]))
        objective.append(float(gap.detach()))
        if verbose:
            print(f"optimize_input_canaries: meta-step {step + 1}/{meta_steps}: gap {objective[-1]:.4f}", flush=True)
    return CanaryDesign(
        examples=TensorDataset(z.detach().clone(), labels.clone()),
        initial=TensorDataset(initial, labels.clone()),
        objective=objective,
        rows=[int(r) for r in rows],
    )
