"""DPSGD's self-checks (each broken on purpose) and its opt-in clipping telemetry."""

import math
import subprocess
import sys

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, names
from lightning_privacy.dpsgd.noise_check import NOISE_FALSE_ALARM, NOISE_MIN_COORDINATES, NoiseCheck
from lightning_privacy.models import TabularMLP
from tests.callbacks._tiny import tiny_loader, tiny_module, trainer


class Breaker(Callback):
    """Breaks one part of DP-SGD after DPSGD wired it (placed before DPSGD in the callback list)."""

    def __init__(self, what):
        self.what = what

    def on_train_start(self, trainer, pl_module):
        optimizer = trainer.optimizers[0]
        if self.what == "clipping":
            optimizer.max_grad_norm = 1e6  # the optimizer no longer clips to the callback's C
        elif self.what == "noise":
            optimizer.noise_multiplier = 0.0
        elif self.what == "accountant":
            optimizer.step_hook = None  # steps happen, nothing is accounted

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.what == "grad_sample":
            dict(pl_module.named_parameters())["net.2.weight"].grad_sample = None


def _fit(what, **dpsgd):
    torch.manual_seed(0)
    t = trainer([Breaker(what), DPSGD(**{"noise_multiplier": 1.0, **dpsgd})], max_epochs=1)
    t.fit(tiny_module(), train_dataloaders=tiny_loader())
    return t


def test_untouched_run_passes_every_check():
    t = _fit(None)
    assert t.global_step > 0


def test_missing_per_sample_gradient_names_the_parameter():
    with pytest.raises(MisconfigurationException, match=r"`net\.2\.weight` has no per-sample gradient"):
        _fit("grad_sample")


def test_unclipped_gradients_are_caught():
    with pytest.raises(MisconfigurationException, match=r"not the sum of its per-sample gradients clipped"):
        _fit("clipping", max_grad_norm=1e-3)


def test_missing_noise_is_caught():
    with pytest.raises(MisconfigurationException, match=r"not noised as configured"):
        _fit("noise")


def test_unaccounted_steps_are_caught():
    with pytest.raises(MisconfigurationException, match=r"accountant recorded 0 steps .* took 8"):
        _fit("accountant")


@pytest.mark.parametrize("max_grad_norm, expected", [(1e6, 0.0), (1e-6, 1.0)])
def test_clip_fraction_extremes(max_grad_norm, expected, tmp_path):
    torch.manual_seed(0)
    dp = DPSGD(noise_multiplier=1e-6, max_grad_norm=max_grad_norm, log_clipping=True)
    t = trainer([dp], tmp_path, max_epochs=2, logger=TensorBoardLogger(tmp_path))
    t.fit(tiny_module(), train_dataloaders=tiny_loader())
    assert t.callback_metrics[names.DP_CLIP_FRACTION].item() == expected
    assert t.callback_metrics[names.DP_GRAD_NORM_MEDIAN].item() > 0


def test_clipping_telemetry_matches_a_direct_computation(tmp_path):
    """Median and clip fraction equal those of per-sample gradients recomputed one example at a time."""

    class Recorder(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            model = tiny_module()
            model.load_state_dict(pl_module.state_dict())
            for x, y in zip(*batch):
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x[None]), y[None]).backward()
                self.norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())

    torch.manual_seed(0)
    recorder = Recorder()
    recorder.norms = []
    c = 0.5
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=c, log_clipping=True, clipping_every_n_steps=1)  # every step
    t = trainer([dp, recorder], tmp_path, max_epochs=1)
    t.fit(tiny_module(), train_dataloaders=tiny_loader())
    norms = torch.tensor(recorder.norms, dtype=torch.float64)
    assert t.callback_metrics[names.DP_CLIP_FRACTION].item() == pytest.approx(float((norms > c).double().mean()))
    assert t.callback_metrics[names.DP_GRAD_NORM_MEDIAN].item() == pytest.approx(float(norms.median()), rel=1e-4)


def test_log_clipping_must_be_a_bool():
    with pytest.raises(MisconfigurationException, match="`log_clipping` must be True or False, got 'yes'"):
        DPSGD(noise_multiplier=1.0, log_clipping="yes")


def test_importing_the_package_leaves_the_matplotlib_backend_alone():
    code = (
        "import matplotlib; matplotlib.use('svg')\n"
        "import importlib, pkgutil, lightning_privacy\n"
        "for m in pkgutil.walk_packages(lightning_privacy.__path__, 'lightning_privacy.'):\n"
        "    if 'sdv' not in m.name: importlib.import_module(m.name)\n"
        "from lightning_privacy.figures import bayes_security_figure\n"
        "bayes_security_figure([{'epoch': 0, 'safe': 0.89, 'closed': 0.9}], {'privacy/mia_bayes_security': 0.89})\n"
        "print(matplotlib.get_backend())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_clipping_telemetry_every_n_steps_records_those_steps_exactly(tmp_path):
    """clipping_every_n_steps=3: the norms of every example of steps 0, 3, 6, equal to their direct norms."""

    class Recorder(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            model = tiny_module()
            model.load_state_dict(pl_module.state_dict())
            self.batches.append([])
            for x, y in zip(*batch):
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x[None]), y[None]).backward()
                self.batches[-1].append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())

    torch.manual_seed(0)
    recorder = Recorder()
    recorder.batches = []
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=0.5, log_clipping=True, clipping_every_n_steps=3)
    recorded = []
    add = dp._clipping.add
    dp._clipping.add = lambda norms: (recorded.append(norms.clone()), add(norms))
    trainer([dp, recorder], tmp_path, max_epochs=1).fit(tiny_module(), train_dataloaders=tiny_loader())
    steps = len(recorder.batches)
    assert steps == dp.steps and len(recorded) == len(range(0, steps, 3)) > 1
    for norms, direct in zip(recorded, recorder.batches[::3]):
        assert norms.tolist() == pytest.approx(direct, rel=1e-4)


def test_clipping_every_n_steps_must_be_a_positive_int():
    assert DPSGD(noise_multiplier=1.0, log_clipping=True, clipping_every_n_steps=1).clipping_every_n_steps == 1
    with pytest.raises(MisconfigurationException, match="`clipping_every_n_steps` must be an int >= 1, got 0"):
        DPSGD(noise_multiplier=1.0, log_clipping=True, clipping_every_n_steps=0)


def _frozen_batchnorm_module(keep_eval: bool):
    """A frozen backbone with BatchNorm (passes Opacus' validator, which checks trainable layers) and a trainable head."""
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
            self.backbone.requires_grad_(False)
            self.head = torch.nn.Linear(16, 2)

        def on_train_epoch_start(self):
            if keep_eval:
                self.backbone.eval()  # running statistics: examples stay independent

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.head(self.backbone(x)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.head.parameters(), lr=0.1)

    return Module()


def test_a_frozen_batchnorm_in_training_mode_is_caught(tmp_path):
    module = _frozen_batchnorm_module(keep_eval=False)
    with pytest.raises(MisconfigurationException, match=r"`backbone.1` \(BatchNorm1d\) normalises with the statistics"):
        trainer([DPSGD(noise_multiplier=1.0)], tmp_path, max_epochs=1).fit(module, train_dataloaders=tiny_loader())


def test_a_frozen_batchnorm_kept_in_eval_mode_trains(tmp_path):
    module = _frozen_batchnorm_module(keep_eval=True)
    dp = DPSGD(noise_multiplier=1.0)
    trainer([dp], tmp_path, max_epochs=2).fit(module, train_dataloaders=tiny_loader())
    assert dp.steps > 0


# ------------------------------------------------------------------------------------------- the noise check
class Logistic(pl.LightningModule):
    """A 2-parameter logistic regression: too few coordinates for one step's noise to be judged."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.linear(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _logistic_fit(seed, breaker=None, epochs=1):
    torch.manual_seed(seed)
    x = torch.randn(256, 1)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).float()), batch_size=2)  # 128 steps per epoch
    dp = DPSGD(noise_multiplier=1.0, sampling_seed=seed)
    trainer([breaker or Callback(), dp], max_epochs=epochs).fit(Logistic(), train_dataloaders=loader)
    return dp


def _fits_without_abort(seeds):
    for seed in seeds:
        dp = _logistic_fit(seed)
        assert dp._checks.noise.done and dp._checks.noise.count == NOISE_MIN_COORDINATES  # 128 steps × 2


def test_forty_seeded_fits_of_a_two_parameter_model_train():
    _fits_without_abort(range(40))  # the factor-of-two rule aborted 15 of these 40


@pytest.mark.slow
def test_two_hundred_seeded_fits_of_a_two_parameter_model_train():
    _fits_without_abort(range(40, 240))


@pytest.mark.parametrize("factor", [0.0, 0.5, 2.0])
def test_noise_off_by_a_factor_is_caught_on_the_two_parameter_model(factor):
    class Scale(Callback):
        def on_train_start(self, trainer, pl_module):
            trainer.optimizers[0].noise_multiplier = factor

    with pytest.raises(
        MisconfigurationException, match=r"over 256 coordinates \(128 steps\).*not noised as configured"
    ):
        _logistic_fit(0, Scale())


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_noise_off_by_a_factor_is_caught_within_two_steps_of_a_178_parameter_model(factor):
    class Scale(Callback):
        def on_train_start(self, trainer, pl_module):
            trainer.optimizers[0].noise_multiplier = factor

    torch.manual_seed(0)
    with pytest.raises(MisconfigurationException, match=r"over 356 coordinates \(2 steps\).*not noised"):
        trainer([Scale(), DPSGD(noise_multiplier=1.0)], max_epochs=1).fit(
            tiny_module(), train_dataloaders=tiny_loader()
        )


def test_noise_check_bounds_are_chi_square_quantiles_and_rarely_reject_true_noise():
    check = NoiseCheck(max_grad_norm=2.0, noise_multiplier=1.5)
    check.count, check.eps = NOISE_MIN_COORDINATES, 0.0
    low, high = check.bounds()
    # independent: the standard deviation of n Gaussian coordinates is σC·√(χ²(n)/n); at n = 256 the 5e-10 quantiles
    # are about 0.71 and 1.32 of σC (Wilson–Hilferty), so noise off by a factor of two cannot pass
    z = 6.1094  # standard normal 1 - 5e-10 quantile
    n = NOISE_MIN_COORDINATES
    wh = [(1 - 2 / (9 * n) + s * z * math.sqrt(2 / (9 * n))) ** 1.5 for s in (-1, 1)]
    assert low / 3.0 == pytest.approx(wh[0], rel=2e-3) and high / 3.0 == pytest.approx(wh[1], rel=2e-3)
    assert 0.5 * 3.0 < low and high < 2.0 * 3.0
    # 20,000 simulated checks of true noise over 2..256 coordinates: none rejected (expected 2e-5 rejections)
    rng = np.random.default_rng(0)
    for n in (2, 16, 256):
        noise = rng.normal(0.0, 3.0, size=(20_000 // 3, n))
        check = NoiseCheck(max_grad_norm=2.0, noise_multiplier=1.5)
        check.count = n
        low, high = check.bounds()
        std = np.sqrt((noise**2).mean(axis=1))
        assert ((std >= low) & (std <= high)).all()


def test_noise_check_bounds_are_the_exact_chi_square_quantiles_at_every_count():
    """Pins the χ² degrees of freedom: n noise coordinates with known mean 0 give Σ noise² / (σC)² ~ χ²(n) (not
    n − 1, which at n = 16 widens the lower bound by 11%); noise 1% below the lower bound is rejected, 1% above it
    passes."""
    from scipy.stats import chi2

    sigma_c = 1.5 * 2.0
    for n in (2, 16, 256):
        check = NoiseCheck(max_grad_norm=2.0, noise_multiplier=1.5)
        check.count, check.eps = n, 0.0
        low, high = check.bounds()
        tail = NOISE_FALSE_ALARM / 2
        assert low == pytest.approx(sigma_c * math.sqrt(chi2.ppf(tail, n) / n), rel=1e-12), n
        assert high == pytest.approx(sigma_c * math.sqrt(chi2.isf(tail, n) / n), rel=1e-12), n
        for factor, rejected in ((0.99, True), (1.01, False), (0.99 * high / low, False), (1.01 * high / low, True)):
            check = NoiseCheck(max_grad_norm=2.0, noise_multiplier=1.5)
            check.count, check.steps, check.noise_sq = n, 1, n * (factor * low) ** 2
            if rejected:
                with pytest.raises(MisconfigurationException, match="not noised as configured"):
                    check.check()
            else:
                check.check()


class _ClipAt(Callback):
    """The optimizer clips to ``factor`` × the callback's C (and noises with the callback's σ·C)."""

    def __init__(self, factor):
        self.factor = factor

    def on_train_start(self, trainer, pl_module):
        optimizer = trainer.optimizers[0]
        optimizer.max_grad_norm *= self.factor
        optimizer.noise_multiplier /= self.factor  # the noise stays σ·C: only the clipping is off


def test_a_clipping_norm_one_and_a_half_times_c_is_caught_on_a_single_example():
    """Pins the clipping check's tolerance, 1e-4·(‖expected sum‖ + C), not 1e-4·‖expected sum‖ + C: one example's
    gradient clipped to 1.5·C instead of C is off by 0.5·C, less than C, and is caught on the first step; the same
    run clipping to C trains."""
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=1)  # p = 1/256: ~1 example per step
    sizes = []

    class Sizes(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            sizes.append(len(batch[0]))

    for factor in (1.5, 1.0):
        torch.manual_seed(0)
        dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1e-3, sampling_seed=5)  # steps 0 and 1: one example each
        t = trainer([_ClipAt(factor), dp, Sizes()], max_steps=2)
        if factor == 1.5:
            with pytest.raises(MisconfigurationException, match=r"not the sum of its per-sample gradients clipped"):
                t.fit(tiny_module(), train_dataloaders=loader)
            assert sizes == [1] and t.global_step == 0
        else:
            t.fit(tiny_module(), train_dataloaders=loader)
            assert t.global_step == 2


def test_the_clipped_sum_bound_of_an_average_over_ranks_is_divided_by_their_number():
    """Pins FSDP2's bound: the ranks' average of clipped sums of B examples (over W ranks) is within B·C / W; a sum
    of norm 0.75·B·C averaged over two ranks is refused, one of 0.45·B·C passes."""
    from lightning_privacy.dpsgd.checks import check_clipped_sum_bound

    c, batch = 0.5, 10

    def shards(norm):  # two shards of one averaged sum, of total norm `norm`
        return [torch.full((4,), norm / math.sqrt(8)), torch.full((4,), -norm / math.sqrt(8))]

    check_clipped_sum_bound(shards(0.45 * batch * c), max_grad_norm=c, batch_size=batch, averaged_over=2)
    with pytest.raises(MisconfigurationException, match=r"/ 2 ranks \(FSDP2 averages their sums\) = 2\.5"):
        check_clipped_sum_bound(shards(0.75 * batch * c), max_grad_norm=c, batch_size=batch, averaged_over=2)
    check_clipped_sum_bound(shards(0.75 * batch * c), max_grad_norm=c, batch_size=batch)  # one process: B·C


class _PositionEmbedding(pl.LightningModule):
    """Token + position embeddings, the positions looked up once per batch with ids of shape [1, T] (GPT-2's `wpe`)."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos, self.head = torch.nn.Embedding(20, 8), torch.nn.Embedding(6, 8), torch.nn.Linear(8, 2)

    def forward(self, ids):
        return self.head((self.tok(ids) + self.pos(torch.arange(ids.shape[1])[None, :])).mean(1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1], reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_layer_called_on_a_broadcast_batch_is_named_with_the_fix(tmp_path, mode):
    """The issue: GPT-2's `wpe` (position ids [1, T]) stopped hooks mode at a self-check naming no parameter, and ghost
    mode at Opacus' "stack expects each tensor to be equal size"."""
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 20, (128, 6), generator=g), torch.randint(0, 2, (128,), generator=g))
    t = trainer([DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0)], tmp_path, max_epochs=1)
    with pytest.raises(MisconfigurationException) as info:
        t.fit(_PositionEmbedding(), train_dataloaders=DataLoader(data, batch_size=16))
    message = str(info.value)
    assert "`pos.weight` (1) count other examples than the batch's" in message
    assert "`tok.weight`" not in message and "position_ids.repeat(batch_size, 1)" in message


class _NonFiniteFrom(TabularMLP):
    """The tiny MLP whose loss turns NaN (``what="loss"``) or one of whose weights turns NaN (``what="weights"``) from
    optimizer step ``at`` on."""

    def __init__(self, *args, what: str = "loss", at: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.what, self.at = what, at

    def training_step(self, batch, batch_idx):
        if self.global_step >= self.at and self.what == "weights":
            with torch.no_grad():
                self.net[0].weight[0, 0] = float("nan")
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step >= self.at and self.what == "loss" else loss


@pytest.mark.parametrize("what", ["loss", "weights"])
def test_the_noise_check_names_a_nan_loss_or_nan_weights_not_the_noise(what):
    """The loss, or a weight, turns NaN at step 1, within the noise check's two steps (178 coordinates a step, 256
    needed): the sentence names the non-finite clipped sum (the loss or the gradients) and, where they were, the
    weights, with the step each was first seen at; it no longer says that the gradients are not noised as configured
    (the noise is fine)."""
    torch.manual_seed(0)
    module = _NonFiniteFrom(8, hidden=(16,), lr=0.5, what=what, at=1)
    with pytest.raises(MisconfigurationException) as raised:
        trainer([DPSGD(noise_multiplier=1.0)], max_epochs=1).fit(module, train_dataloaders=tiny_loader())
    message = str(raised.value)
    assert message.startswith(
        "DP-SGD self-check: the training is not finite, so the noise added to the gradients cannot be read back over "
        "the 2 steps checked: the clipped sum of the per-example gradients held 178 non-finite value(s) (NaN or ±inf), "
        "first at step 1: the loss or the gradients were NaN or infinite"
    ), message
    # a NaN loss makes the weights NaN only at the next step (unchecked); a NaN weight is named at its step
    assert ("the weights held 1 non-finite value(s), first at step 1." in message) == (what == "weights"), message
    assert "not noised as configured" not in message and "standard deviation nan" not in message


def test_the_noise_check_still_blames_noise_that_is_off_when_everything_is_finite():
    check = NoiseCheck(max_grad_norm=1.0, noise_multiplier=1.0)
    params = [torch.zeros(300, requires_grad=True)]
    params[0].grad = torch.full((300,), 3.0)  # the read-back noise: 3.0 everywhere, σC = 1
    check.add(params, [torch.zeros(300)], scale=1.0, step=7)
    with pytest.raises(MisconfigurationException, match=r"standard deviation 3 over 300 coordinates.*not noised"):
        check.check()
    assert check.non_finite_counts == {"weights": 0, "sums": 0}
