"""End-to-end matrix beyond the MLP: every privacy callback on a CNN + GroupNorm, an Embedding + DPMultiheadAttention
transformer block, a DPLSTM, a frozen backbone with a trainable head and bf16-mixed, with both of DPSGD's
``grad_sample_mode`` values, which must agree; PANORAMIA on the image model.

A GPU row runs the same matrix on CUDA where one exists (never on the CPU-only machine these tests were written on).
"""

import math

import pytest
import torch

from lightning_privacy import (
    DPSGD,
    AttributeInferenceMonitor,
    BayesSecurityMonitor,
    EpsilonStarAudit,
    PanoramiaAudit,
    names,
)
from lightning_privacy.functional.attribute_sensitivity import gram_backend_reason
from lightning_privacy.functional.attributes import SensitiveAttribute
from tests.callbacks._architectures import (
    FrozenBackbone,
    ImageCNN,
    TokenLSTM,
    TokenTransformer,
    digit_datasets,
    loaders,
    token_datasets,
)
from tests.callbacks._tiny import trainer


def _corner(images, value):
    """The brightness of each image's top-left 2×2 corner (a custom attribute of an image)."""
    out = images.clone()
    out[:, :, :2, :2] = value
    return out


def _first_token(tokens, value):
    """The first token of each sequence (a custom attribute of a text)."""
    out = tokens.clone()
    out[:, 0] = value
    return out


CORNER = SensitiveAttribute.custom(substitute=_corner, values=[0.0, 0.5, 1.0], name="corner")
FIRST_TOKEN = SensitiveAttribute.custom(substitute=_first_token, values=[0, 1, 2], name="first_token")

CASES = {  # model, data, attribute, Trainer arguments
    "cnn_groupnorm": (ImageCNN, digit_datasets, CORNER, {}),
    "transformer_block": (TokenTransformer, token_datasets, FIRST_TOKEN, {}),
    "dplstm": (TokenLSTM, token_datasets, FIRST_TOKEN, {}),
    "frozen_backbone": (FrozenBackbone, digit_datasets, CORNER, {}),
    "bf16_mixed": (ImageCNN, digit_datasets, CORNER, {"precision": "bf16-mixed"}),
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


def _fit(case, mode, device):
    make, data, attribute, kwargs = CASES[case]
    torch.manual_seed(0)
    model = make()
    assert gram_backend_reason(model) is None  # the monitor's default backend is the Gram one on every layer here
    callbacks = [
        DPSGD(noise_multiplier=1.0, grad_sample_mode=mode),
        BayesSecurityMonitor(),
        AttributeInferenceMonitor(attribute=attribute),
        EpsilonStarAudit(),
    ]
    if case == "cnn_groupnorm":
        callbacks.append(PanoramiaAudit(audit_size=64, generator_size=96, helper_epochs=1, num_thresholds=10))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    t = trainer(callbacks, max_epochs=2, accelerator=device, **kwargs)
    t.fit(model, *loaders(data()))
    return t, callbacks, model, before


def _check_run(case, t, callbacks, model, before):
    dpsgd, _, _, epsilon_star, *panoramia = callbacks
    assert t.global_step == dpsgd.steps > 0
    mia = float(t.callback_metrics[names.MIA_BAYES_SECURITY])
    ai = float(t.callback_metrics[names.AI_BAYES_SECURITY])
    assert 0 < mia <= ai <= 1  # R_t <= 2C: attribute inference is never easier than membership inference
    assert math.isfinite(epsilon_star.results[names.EPSILON_STAR]) and epsilon_star.results[names.EPSILON_STAR] >= 0
    if panoramia:
        result = panoramia[0].result
        assert result is not None and all(math.isfinite(v) for v in result.metrics().values())
    trained = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name].to(p.device))}
    if case == "frozen_backbone":
        assert trained == {"head.weight", "head.bias"}  # the frozen backbone is untouched, the head learns
    else:
        assert trained == {name for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "case",
    [pytest.param("cnn_groupnorm", marks=pytest.mark.slow), *(c for c in CASES if c != "cnn_groupnorm")],
)
def test_every_callback_on_the_architecture_in_both_modes(case, device):
    runs = {mode: _fit(case, mode, device) for mode in ("hooks", "ghost")}
    for run in runs.values():
        _check_run(case, *run)
    hooks, ghost = (runs[m][0].callback_metrics for m in ("hooks", "ghost"))
    # same data, same noise draws: the two modes train the same model, so the measured bounds agree
    for key in (names.MIA_BAYES_SECURITY, names.AI_BAYES_SECURITY):
        assert float(ghost[key]) == pytest.approx(float(hooks[key]), rel=1e-3 if case == "bf16_mixed" else 1e-5)
