"""A user's mistakes with DPSGD itself, each one sentence naming what was given and the fix (issue 55): DPSGD given
twice (Lightning's "state_key must be unique", or "already an Opacus DPOptimizer … make_private" before), and a resume
with other DPSGD arguments than the checkpoint's (which said the checkpoint "has no DPSGD state")."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import DPSGD
from tests.callbacks._tiny import tiny_loader, tiny_module, trainer

TWICE = r"The Trainer's callbacks hold DPSGD 2 times: DPSGD\(noise_multiplier=1\.0, max_grad_norm=1\.0\) and "


def test_dpsgd_given_twice_is_one_sentence_naming_both():
    """The same arguments twice: refused at ``Trainer(...)``, where Lightning validates the callbacks' state keys
    (the guard of the private locals ``_compat.callbacks_sharing_state_key`` reads: it fails if Lightning changes)."""
    with pytest.raises(MisconfigurationException, match=TWICE + r"DPSGD\(noise_multiplier=1\.0, max_grad_norm=1\.0"):
        trainer([DPSGD(noise_multiplier=1.0), DPSGD(noise_multiplier=1.0)])
    with pytest.raises(MisconfigurationException, match=r"so give exactly one DPSGD\.$"):
        trainer([DPSGD(noise_multiplier=1.0), DPSGD(noise_multiplier=1.0)])


def test_dpsgd_given_twice_with_other_arguments_is_the_same_sentence_at_fit():
    t = trainer([DPSGD(noise_multiplier=1.0), DPSGD(noise_multiplier=2.0)], max_epochs=1)
    with pytest.raises(MisconfigurationException, match=TWICE + r"DPSGD\(noise_multiplier=2\.0, max_grad_norm=1\.0"):
        t.fit(tiny_module(), tiny_loader())
    assert t.global_step == 0


def test_reading_the_state_key_elsewhere_is_not_a_duplicate():
    first, second = DPSGD(noise_multiplier=1.0), DPSGD(noise_multiplier=1.0)
    assert first.state_key == second.state_key  # (the same key, read outside Lightning's validation)
    trainer([first])  # one DPSGD: no sentence
    trainer([second])


def test_a_resume_with_another_sigma_names_what_differs(tmp_path):
    torch.manual_seed(0)
    t = trainer([DPSGD(noise_multiplier=1.0)], tmp_path, max_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(tiny_module(), tiny_loader())
    t.save_checkpoint(tmp_path / "run.ckpt")
    resumed = trainer([DPSGD(noise_multiplier=2.0, max_grad_norm=0.5)], tmp_path, max_epochs=2)
    expected = (
        "The checkpoint's DPSGD was built with other arguments than this one (noise_multiplier=1.0 in the checkpoint, "
        "2.0 here, max_grad_norm=1.0 in the checkpoint, 0.5 here)"
    )
    with pytest.raises(RuntimeError, match=re.escape(expected)) as error:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed.fit(tiny_module(), tiny_loader(), ckpt_path=tmp_path / "run.ckpt")
    assert "has no DPSGD state" not in str(error.value) and "Resume with the checkpoint's arguments" in str(error.value)
    bare = trainer([DPSGD(noise_multiplier=1.0)], tmp_path, max_epochs=2)  # a checkpoint of a fit without DPSGD
    plain = trainer([], tmp_path, max_epochs=1)
    plain.fit(tiny_module(), tiny_loader())
    plain.save_checkpoint(tmp_path / "plain.ckpt")
    with pytest.raises(RuntimeError, match="The checkpoint has no DPSGD state under"):
        bare.fit(tiny_module(), tiny_loader(), ckpt_path=tmp_path / "plain.ckpt")
