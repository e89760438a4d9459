"""DPSGD's strategy check: one device or script-launched DDP; everything else refused in setup, named, with what works.

The checks run ``DPSGD.setup`` on a Trainer that was built but never launched: no process is started.
"""

import lightning.pytorch as pl
import pytest
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
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
        (_deepspeed, "DeepSpeedStrategy"),
        (FSDPStrategy, "FSDPStrategy"),
        (ModelParallelStrategy, "ModelParallelStrategy"),
    ],
)
def test_other_strategies_are_refused_by_exact_type(tmp_path, monkeypatch, make, name):
    strategy = make()
    if isinstance(strategy, FSDPStrategy):
        # Lightning builds FSDP on GPUs only: a CPU Trainer that reports it as its strategy reaches the same check
        t = trainer([], tmp_path)
        monkeypatch.setattr(pl.Trainer, "strategy", property(lambda self: strategy))
    else:
        t = trainer([], tmp_path, strategy=strategy, devices=2, use_distributed_sampler=False)
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
