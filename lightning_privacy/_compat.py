"""Every use of a private Lightning, Opacus or TensorBoard-writer API in lightning_privacy, in one place.

Each function names the private attribute it touches, the versions it was checked on and the test that
fails loudly if a new release changes it. Checked on lightning 2.6.6, opacus 1.6.0, torch 2.13.0.

| private API | used for | guarding test |
|---|---|---|
| ``trainer.fit_loop._data_source`` (``_DataLoaderSource``) | Poisson sampling of any train loader | ``tests/callbacks/test_dpsgd.py::test_poisson_swap_fails_loudly_if_lightning_changes_its_data_source`` and the loader-source tests |
| ``trainer._accelerator_connector.use_distributed_sampler`` | DDP needs ``use_distributed_sampler=False`` | ``tests/callbacks/test_dpsgd.py::test_ddp_needs_use_distributed_sampler_false`` |
| the closure of ``DPOptimizer.step_hook`` | the accountant of a user's ``make_private`` | ``tests/callbacks/test_bayes_security_monitor.py::test_works_with_a_users_own_opacus_setup`` |
| ``SummaryWriter._get_file_writer()`` | one HPARAMS session with the privacy settings | ``tests/callbacks/test_tensorboard_view.py`` |
| ``nn.Module._forward_hooks`` and the other hook dicts | a hook-free copy of a model (PANORAMIA's helper) | ``tests/functional/test_panoramia_pipeline.py::test_fresh_copy_and_losses`` |
| SDV's ``BaseSynthesizer._set_random_state`` | seeding the first ``sample()`` of an SDV synthesizer | ``tests/generators/test_sdv_adapter.py`` (same seed, same rows; skipped without the ``sdv`` extra) |
| ``DDPStrategy._start_method`` | refusing ``ddp_spawn``/``ddp_fork`` (the main process keeps untrained callbacks) | ``tests/callbacks/test_strategies.py::test_ddp_start_method_is_read_from_lightning`` |
| torch's CPU generator state layout (``CPUGeneratorImplState``: the 624 MT19937 words at bytes 24..5016) | a CPU noise generator with its whole 19,968-bit state secret (``manual_seed`` keeps 32 bits of a seed) | ``tests/test_noise.py::test_cpu_generator_state_layout_fails_loudly_if_torch_changes_it`` |
| the locals of Lightning's ``_validate_callbacks_list`` (``seen_callbacks``, ``stateful_callbacks``) | DPSGD given twice with the same arguments: one sentence naming both instead of "state_key must be unique" | ``tests/callbacks/test_dpsgd_user_mistakes.py::test_dpsgd_given_twice_is_one_sentence_naming_both`` |
| ``nn.Module._backward_hooks`` / ``_backward_pre_hooks`` (set aside, restored in order) | the neighbour check's functional passes under vmap in hooks and ghost mode | ``tests/callbacks/test_neighbour_check.py::test_in_hooks_mode_the_check_runs_under_vmap`` |
| ``nn.Module._forward_hooks`` (Hugging Face's ``make_inputs_require_grads``, set aside, restored) | vmap through a Hugging Face model with gradient checkpointing on (functional mode's per-example passes) | ``tests/callbacks/test_stock_models.py::test_hugging_face_gradient_checkpointing_goes_through_vmap`` |
| ``param._norm_sample`` (Opacus fast gradient clipping) | ghost clipping's per-parameter norms: reset before and checked after every first backward pass | ``tests/callbacks/test_dpsgd_ghost.py::test_norm_sample_attribute_fails_loudly_if_opacus_renames_it`` |
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import lightning.pytorch as pl
from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource

__all__ = [
    "PoissonDataSource",
    "backward_hooks_detached",
    "callbacks_sharing_state_key",
    "accountant_from_step_hook",
    "cpu_generator_from_words",
    "clear_norm_sample",
    "ddp_start_method",
    "forward_pre_hooks",
    "hugging_face_input_grad_hooks_off",
    "install_train_loader_transform",
    "norm_sample",
    "original_train_loader",
    "remove_module_hooks",
    "seed_sdv_synthesizer",
    "tensorboard_file_writer",
    "uses_distributed_sampler",
]


# --- Lightning: the callbacks list's validation ------------------------------------------------------------------------
def callbacks_sharing_state_key(callback: Any, key: str) -> list:
    """The callbacks of the list Lightning is validating that already hold ``key``, when ``callback.state_key`` is read
    by Lightning's ``callback_connector._validate_callbacks_list`` (its locals ``seen_callbacks`` and
    ``stateful_callbacks``, lightning 2.6.6) at ``Trainer(callbacks=...)``; else ``[]`` (and whenever Lightning changes
    them: its own "state_key must be unique" error then stands)."""
    try:
        frame = inspect.currentframe()
        for _ in range(4):  # this function <- DPSGD's helpers and the state_key getter <- its reader
            frame = frame.f_back if frame is not None else None
            if frame is None or frame.f_code.co_name == "_validate_callbacks_list":
                break
        if frame is None or frame.f_code.co_name != "_validate_callbacks_list":
            return []
        seen, listed = frame.f_locals.get("seen_callbacks"), frame.f_locals.get("stateful_callbacks")
        if not isinstance(seen, set) or key not in seen or not isinstance(listed, list):
            return []
        return [other for other in listed if other is not callback and type(other) is type(callback)]
    except Exception:  # noqa: BLE001 (a private layout that changed: Lightning's own message stands)
        return []


# --- Lightning: the train-data source --------------------------------------------------------------------------------
@dataclasses.dataclass
class PoissonDataSource(_DataLoaderSource):
    """A train-data source that hands out the original loader passed through named transforms, in their order.

    Lightning has no public hook to replace the train dataloader whichever way it is supplied (datamodule,
    ``LightningModule.train_dataloader`` or ``fit(train_dataloaders=...)``). All three end up in
    ``trainer.fit_loop._data_source``, which ``fit_loop.setup_data`` asks for the loader after ``on_fit_start``.
    Transforms are ordered by their ``order`` (lower first): e.g. inserting canary rows (order 0) happens before
    DPSGD's Poisson sampling (order 100), whichever callback is listed first.
    """

    original: _DataLoaderSource = None  # type: ignore[assignment]
    transforms: Dict[str, Tuple[int, Callable[[Any], Any]]] = dataclasses.field(default_factory=dict)

    def dataloader(self) -> Any:
        loader = self.original.dataloader()
        for _, transform in sorted(self.transforms.values(), key=lambda item: item[0]):
            loader = transform(loader)
        return loader


def install_train_loader_transform(
    trainer: pl.Trainer, transform: Callable[[Any], Any], *, key: str = "poisson", order: int = 100
) -> None:
    """Make ``trainer`` train on ``transform(loader)`` for the loader it would have used.

    Installing again under the same ``key`` (``fit`` called again) replaces that transform; other keys are kept.

    Raises:
        RuntimeError: if this Lightning version has no ``fit_loop._data_source`` of the known type.
    """
    fit_loop = trainer.fit_loop
    source = getattr(fit_loop, "_data_source", None)
    if not isinstance(source, _DataLoaderSource):
        raise RuntimeError(
            "lightning_privacy could not find Lightning's train-data source (trainer.fit_loop._data_source); "
            f"this Lightning version ({pl.__version__}) is not supported by DPSGD's Poisson sampling."
        )
    if not isinstance(source, PoissonDataSource):
        source = PoissonDataSource(instance=source.instance, name=source.name, original=source)
        fit_loop._data_source = source
    source.transforms[key] = (order, transform)


def original_train_loader(trainer: pl.Trainer, *, before: Optional[str] = None) -> Any:
    """The user's own train loader, passed through the installed transforms that come before ``before``."""
    source = trainer.fit_loop._data_source
    if not isinstance(source, PoissonDataSource):
        return source.dataloader()
    loader = source.original.dataloader()
    limit = source.transforms[before][0] if before in source.transforms else None
    for order, transform in sorted(source.transforms.values(), key=lambda item: item[0]):
        if limit is not None and order >= limit:
            break
        loader = transform(loader)
    return loader


# --- Lightning: the trainer's sampler setting ------------------------------------------------------------------------
def uses_distributed_sampler(trainer: pl.Trainer) -> bool:
    """``Trainer(use_distributed_sampler=...)``; Lightning keeps it only on the private accelerator connector."""
    return bool(getattr(trainer._accelerator_connector, "use_distributed_sampler", True))


def ddp_start_method(strategy: Any) -> str:
    """How a ``DDPStrategy`` starts its processes: ``"popen"`` (a script, torchrun, SLURM) or spawn/fork/forkserver.

    Lightning keeps it only as the private ``_start_method`` (``strategy="ddp_spawn"`` sets ``"spawn"``).
    """
    method = getattr(strategy, "_start_method", None)
    if not isinstance(method, str):
        raise RuntimeError(
            f"lightning_privacy could not read how {type(strategy).__name__} starts its processes (_start_method); "
            f"this Lightning version ({pl.__version__}) is not supported by DPSGD under DDP."
        )
    return method


# --- Opacus: the accountant behind a DPOptimizer's step hook ---------------------------------------------------------
def accountant_from_step_hook(optimizer: Any) -> Optional[Any]:
    """The ``IAccountant`` whose ``get_optimizer_hook_fn`` made ``optimizer.step_hook``, or ``None``.

    Opacus' ``make_private`` attaches ``accountant.get_optimizer_hook_fn(sample_rate)``, a closure over the
    accountant (``self``); that closure is the only place the accountant of a user's own run can be found.
    """
    from opacus.accountants import IAccountant

    hook = getattr(optimizer, "step_hook", None)
    if hook is None:
        return None
    candidate = inspect.getclosurevars(hook).nonlocals.get("self")
    return candidate if isinstance(candidate, IAccountant) else None


# --- Opacus: ghost clipping's per-parameter norms ----------------------------------------------------------------------
def norm_sample(param: Any) -> Optional[Any]:
    """The per-example gradient norms of ``param`` that Opacus' fast/ghost clipping hooks left, or ``None``.

    ``GradSampleHooksFastGradientClipping`` stores them on the parameter as ``_norm_sample`` (shape ``[batch]``) and
    combines them over ``trainable_parameters`` in ``get_norm_sample``; Opacus never resets them, so a parameter the
    last backward did not reach would keep the previous batch's norms.
    """
    return getattr(param, "_norm_sample", None)


def clear_norm_sample(param: Any) -> None:
    """Forget ``param``'s norms from an earlier batch (see :func:`norm_sample`)."""
    if hasattr(param, "_norm_sample"):
        del param._norm_sample


# --- torch.utils.tensorboard: the writer of hparams summaries --------------------------------------------------------
def tensorboard_file_writer(logger: Any) -> Optional[Any]:
    """The event-file writer behind a ``TensorBoardLogger`` (what Lightning's own ``log_hyperparams`` uses)."""
    experiment = getattr(logger, "experiment", None)
    getter = getattr(experiment, "_get_file_writer", None)
    return getter() if callable(getter) else None


# --- torch.nn.Module: hook dictionaries --------------------------------------------------------------------------------
def forward_pre_hooks(module: Any) -> list:
    """The forward pre-hooks registered on ``module`` (torch keeps them in the private ``_forward_pre_hooks``; the
    legacy ``nn.utils.spectral_norm`` is one, found by its type)."""
    return list(getattr(module, "_forward_pre_hooks", {}).values())


@contextlib.contextmanager
def backward_hooks_detached(module: Any) -> Iterator[None]:
    """``module``'s backward hooks (every submodule's private ``_backward_hooks`` and ``_backward_pre_hooks``) set
    aside inside, restored in order after: torch wraps a module that has full backward hooks (Opacus' per-sample hooks)
    in ``BackwardHookFunction``, a classic ``autograd.Function`` that ``torch.func.vmap`` cannot run, so the functional
    engine would fall back to one example at a time. Forward hooks stay (a spectral norm's pre-hook computes the
    weight)."""
    saved = []
    for m in module.modules():
        backward, pre = getattr(m, "_backward_hooks", None), getattr(m, "_backward_pre_hooks", None)
        if backward is None or pre is None:
            continue
        saved.append((m, dict(backward), dict(pre), getattr(m, "_is_full_backward_hook", None)))
        backward.clear()
        pre.clear()
    try:
        yield
    finally:
        for m, backward, pre, full in saved:
            m._backward_hooks.update(backward)
            m._backward_pre_hooks.update(pre)
            if full is not None:
                m._is_full_backward_hook = full


@contextlib.contextmanager
def hugging_face_input_grad_hooks_off(module: Any) -> Iterator[None]:
    """Hugging Face's ``enable_input_require_grads`` forward hooks (``make_inputs_require_grads``, which
    ``gradient_checkpointing_enable()`` registers on the input embeddings: ``output.requires_grad_(True)``, which
    torch.func refuses) set aside from every submodule's private ``_forward_hooks`` inside, restored in place after
    (transformers 5.24). Where Hugging Face renames the function, nothing is set aside and the pass falls back to one
    example at a time (the guarding test sees vmap no longer used)."""
    removed = []
    for m in module.modules():
        hooks = getattr(m, "_forward_hooks", None)
        for key, hook in list((hooks or {}).items()):
            if getattr(hook, "__name__", "") == "make_inputs_require_grads":
                removed.append((hooks, key, hook))
                del hooks[key]
    try:
        yield
    finally:
        for hooks, key, hook in removed:
            hooks[key] = hook


@contextlib.contextmanager
def hugging_face_sdpa_mask_vmappable() -> Iterator[None]:
    """Hugging Face's test whether SDPA may skip the attention mask (``transformers.masking_utils.
    _ignore_causal_mask_sdpa``, transformers 5.24) reads the padding mask's values (``mask.sum() == mask.numel()``), a
    branch on data that vmap cannot take: a stock GPT-2 or Llama given an ``attention_mask`` then fell back to one
    example at a time. Inside, where that read fails under vmap the test answers "do not skip": the explicit causal
    and padding mask is built, the same attention (only SDPA's ``is_causal`` shortcut is not taken); everywhere else,
    and outside, it answers as Hugging Face's. Where transformers is not imported, or renames the function, nothing
    changes (the guarding test sees the loop again)."""
    import sys

    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "_ignore_causal_mask_sdpa", None)
    if original is None:
        yield
        return

    def answer(*args: Any, **kwargs: Any) -> bool:
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            if "data-dependent control flow" not in str(error):
                raise
            return False

    masking._ignore_causal_mask_sdpa = answer
    try:
        yield
    finally:
        masking._ignore_causal_mask_sdpa = original


def remove_module_hooks(module: Any) -> None:
    """Drop every forward/backward hook of ``module`` (not its children): torch has handles, no public "clear all".

    Used on a deep copy, whose hooks (e.g. Opacus' per-sample gradient hooks) belong to the original's owner.
    """
    for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        hooks = getattr(module, name, None)
        if hooks is not None:
            hooks.clear()
    if getattr(module, "_full_backward_hooks", None) is not None:  # older torch: a list (or None)
        module._full_backward_hooks = type(module._full_backward_hooks)()


# --- SDV: the seed of a synthesizer's first sample -----------------------------------------------------------------------
def seed_sdv_synthesizer(model: Any, seed: int) -> bool:
    """Seed an SDV synthesizer's next ``sample()`` (SDV seeds it with a fixed constant; private in SDV 1.x–2.x).

    Returns False when this SDV has no such hook (sampling is then SDV's own fixed-seed stream).
    """
    setter = getattr(model, "_set_random_state", None)
    if not callable(setter):
        return False
    setter(seed)
    return True


# --- torch: the CPU generator's state ----------------------------------------------------------------------------
MT19937_WORDS = 624
_MT_OFFSET = 24  # CPUGeneratorImplState: int64 seed, int32 left, int32 seeded, uint64 next, then uint64 state[624]


def cpu_generator_from_words(words: Any) -> Any:
    """A CPU ``torch.Generator`` whose whole MT19937 state is ``words`` (624 uint32 values).

    ``torch.Generator.manual_seed`` keeps only the low 32 bits of a seed on the CPU (``manual_seed(1)`` and
    ``manual_seed(1 + 2**32)`` draw the same numbers), so a seeded CPU generator has 2³² possible streams: too few for
    noise that must stay secret. The state is written through ``get_state``/``set_state`` (the private layout of
    ``CPUGeneratorImplState``, checked on torch 2.13.0); ``left = 1`` makes the next draw twist the whole state first.
    Raises ``RuntimeError`` if torch no longer reads the state back as written.
    """
    import numpy as np
    import torch

    words = np.asarray(words, dtype=np.uint32)
    if words.shape != (MT19937_WORDS,):
        raise ValueError(f"`words` must hold {MT19937_WORDS} uint32 values, got shape {words.shape}")
    generator = torch.Generator(device="cpu")
    generator.manual_seed(0)
    state = generator.get_state().numpy().copy()
    state[_MT_OFFSET : _MT_OFFSET + 8 * MT19937_WORDS] = np.frombuffer(words.astype(np.uint64).tobytes(), np.uint8)
    state[8:16] = np.frombuffer(np.array([1, 1], dtype=np.int32).tobytes(), np.uint8)  # left = 1, seeded = 1
    generator.set_state(torch.from_numpy(state))
    back = generator.get_state().numpy()[_MT_OFFSET : _MT_OFFSET + 8 * MT19937_WORDS]
    if not np.array_equal(np.frombuffer(back.tobytes(), np.uint64), words.astype(np.uint64)):
        raise RuntimeError(
            "torch's CPU generator state no longer has the MT19937 words at bytes 24..5016 (checked on torch 2.13.0): "
            "update lightning_privacy._compat.cpu_generator_from_words"
        )
    return generator
