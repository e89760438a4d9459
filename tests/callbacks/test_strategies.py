"""DPSGD's strategy check: one device, script-launched DDP or FSDP2 (ModelParallelStrategy, data parallel, ghost);
everything else refused in setup, named, with what works.

The checks run ``DPSGD.setup`` on a Trainer that was built but never launched: no process is started.
"""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import DPSGD, _compat
from tests.callbacks._tiny import tiny_module, trainer

WHAT_WORKS = ("strategy='auto'", "strategy='ddp'", "use_distributed_sampler=False", "torchrun")


def _refusal(t) -> str:
    with pytest.raises(MisconfigurationException) as info:
        DPSGD(noise_multiplier=1.0).setup(t, tiny_module(), "fit")
    return str(info.value)


@pytest.mark.parametrize(
    ("strategy", "start_method"), [("ddp_spawn", "spawn"), ("ddp_fork", "fork"), ("ddp_notebook", "fork")]
)
def test_ddp_that_starts_its_own_processes_is_refused(tmp_path, strategy, start_method):
    t = trainer([], tmp_path, strategy=strategy, devices=2, use_distributed_sampler=False)
    message = _refusal(t)
    assert f"start_method={start_method!r}" in message and strategy in message, message
    assert "ε = 0" in message  # why: the main process would report a run it never saw
    for part in WHAT_WORKS:
        assert part in message, (part, message)


class MyDDP(DDPStrategy):
    pass


class MySingleDevice(SingleDeviceStrategy):
    """A single-device subclass, as XLA's ``SingleDeviceXLAStrategy`` is: refused like any subclass."""


def _my_single_device():
    return MySingleDevice(device=torch.device("cpu"))


def _deepspeed():
    from lightning.pytorch.strategies import DeepSpeedStrategy

    try:
        return DeepSpeedStrategy()
    except (ImportError, MisconfigurationException) as error:  # Lightning refuses to build it without deepspeed
        pytest.skip(f"DeepSpeedStrategy cannot be built here: {error}")


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (MyDDP, "MyDDP"),
        (_my_single_device, "MySingleDevice"),
        (_deepspeed, "DeepSpeedStrategy"),
        (FSDPStrategy, "FSDPStrategy"),
    ],
)
def test_other_strategies_are_refused_by_exact_type(tmp_path, monkeypatch, make, name):
    strategy = make()
    if isinstance(strategy, FSDPStrategy):
        # Lightning builds FSDP on GPUs only: a CPU Trainer that reports it as its strategy reaches the same check
        t = trainer([], tmp_path)
        monkeypatch.setattr(pl.Trainer, "strategy", property(lambda self: strategy))
    else:
        devices = 1 if isinstance(strategy, SingleDeviceStrategy) else 2
        t = trainer([], tmp_path, strategy=strategy, devices=devices, use_distributed_sampler=False)
    assert type(t.strategy) is type(strategy)
    message = _refusal(t)
    assert f"DPSGD does not support {name}:" in message, message
    for part in WHAT_WORKS:
        assert part in message, (part, message)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_one_device_and_script_launched_ddp_are_accepted(tmp_path, strategy):
    devices = 1 if strategy == "auto" else 2
    t = trainer([], tmp_path, strategy=strategy, devices=devices, use_distributed_sampler=False)
    DPSGD(noise_multiplier=1.0).setup(t, tiny_module(), "fit")


def test_ddp_start_method_is_read_from_lightning(tmp_path):
    """Guards ``DDPStrategy._start_method`` (private Lightning), which tells script-launched DDP from ddp_spawn."""
    expected = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork"}
    for strategy, method in expected.items():
        t = trainer([], tmp_path, strategy=strategy, devices=2)
        assert _compat.ddp_start_method(t.strategy) == method, strategy
    with pytest.raises(RuntimeError, match="could not read how object starts its processes"):
        _compat.ddp_start_method(object())


class _Mesh:
    """Stands in for the device mesh ModelParallelStrategy builds once its processes are up."""

    def __init__(self, tensor_parallel: int) -> None:
        self.tensor_parallel = tensor_parallel

    def __getitem__(self, name):
        size = self.tensor_parallel if name == "tensor_parallel" else 2
        return type("Dim", (), {"size": lambda self: size})()


def _model_parallel(tmp_path, monkeypatch, tensor_parallel):
    monkeypatch.setattr(ModelParallelStrategy, "device_mesh", property(lambda self: _Mesh(tensor_parallel)))
    return trainer([], tmp_path, strategy=ModelParallelStrategy(), devices=2, use_distributed_sampler=False)


def test_fsdp2_takes_ghost_clipping_with_mean_reduction_and_no_tensor_parallelism(tmp_path, monkeypatch):
    t = _model_parallel(tmp_path, monkeypatch, tensor_parallel=1)
    DPSGD(noise_multiplier=1.0, grad_sample_mode="ghost").setup(t, tiny_module(), "fit")  # accepted
    default = DPSGD(noise_multiplier=1.0)
    default.setup(t, tiny_module(), "fit")  # the default (auto) runs ghost clipping under FSDP2
    assert default.grad_sample_mode == "ghost"
    for kwargs, expected in (
        ({"grad_sample_mode": "hooks"}, "needs grad_sample_mode='ghost'"),
        ({"grad_sample_mode": "ghost", "loss_reduction": "sum"}, "needs loss_reduction='mean'"),
    ):
        with pytest.raises(MisconfigurationException, match=expected):
            DPSGD(noise_multiplier=1.0, **kwargs).setup(t, tiny_module(), "fit")
    t = _model_parallel(tmp_path, monkeypatch, tensor_parallel=2)
    with pytest.raises(MisconfigurationException, match="tensor-parallel size of 2"):
        DPSGD(noise_multiplier=1.0, grad_sample_mode="ghost").setup(t, tiny_module(), "fit")


def test_audits_that_run_the_model_on_rank_zero_alone_are_refused_under_fsdp2(tmp_path, monkeypatch):
    from lightning_privacy import PanoramiaAudit, PrivacyProfileAudit

    t = _model_parallel(tmp_path, monkeypatch, tensor_parallel=1)
    for audit in (PanoramiaAudit(), PrivacyProfileAudit()):
        with pytest.raises(MisconfigurationException, match=r"rank 0 alone.*FSDP2.*--checkpoint"):
            audit.setup(t, tiny_module(), "fit")
