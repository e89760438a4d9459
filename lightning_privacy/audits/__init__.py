"""Post-training audits as plain functions over a trained model and its data (or over losses).

One module per audit; each function returns a result with the same four views — ``.metrics()``
(``{names.*: float}``), ``.summary()`` (Markdown), ``.figure()`` (a ``matplotlib.figure.Figure``) and
``.to_dict()`` (JSON-ready)::

    from lightning_privacy.audits import audit_epsilon_star

    result = audit_epsilon_star(model, datamodule.member_dataloader(), datamodule.val_dataloader())
    print(result.summary())

- :func:`audit_epsilon_star`, :func:`audit_epsilon_star_from_losses` — Epsilon* and the threshold
  attack's ε lower bound (:mod:`lightning_privacy.audits.epsilon_star`);
- :func:`audit_panoramia` — PANORAMIA with generated non-members (:mod:`lightning_privacy.audits.panoramia`);
- :func:`audit_privacy_profile` — the privacy profile of a logistic-regression head
  (:mod:`lightning_privacy.audits.privacy_profile`);
- :func:`audit_membership` — RMIA, LiRA (online/offline) and the LOSS attack (:mod:`lightning_privacy.audits.membership`),
  with reference models from :func:`lightning_privacy.references.train_references` (which trains them with Lightning
  and DP-SGD, above this layer);
- :func:`audit_canaries` — the one-run canary audit's ε lower bounds from canary scores
  (:mod:`lightning_privacy.audits.canary`; :class:`~lightning_privacy.CanaryAudit` inserts the canaries).
- :func:`language_model_canaries`, :func:`audit_language_model_canaries` — the same game, black box, on a language
  model's fine-tuning: random-token canaries scored against the base model (:mod:`lightning_privacy.audits.lm_canaries`).
- :func:`optimize_input_canaries` — input canaries for ``CanaryAudit("input", examples=...)`` optimised by
  metagradient descent through a proxy training run (:mod:`lightning_privacy.audits.canary_design`).

A checkpoint becomes a model to audit with :func:`load_checkpoint` (``load_checkpoint(Net, "model.ckpt")``,
weights-only): the modules ``DPSGD(fix_modules=True)`` replaced in training are replaced the same way first
(:mod:`lightning_privacy.checkpoints`), so the weights load into the user's own class.

The callbacks (:class:`~lightning_privacy.EpsilonStarAudit`, :class:`~lightning_privacy.PanoramiaAudit`,
:class:`~lightning_privacy.PrivacyProfileAudit`) pick the data from the Trainer, call these functions
and log the results; the ``lightning-privacy audit`` commands parse, build loaders, call and print.
Layers: callbacks / commands / report → audits → metrics, functional → analysis. Nothing here imports
Lightning or pyplot. Names are resolved lazily, so importing the package stays light.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "AuditResult": "lightning_privacy.audits._common",
    "CanaryResult": "lightning_privacy.audits.canary",
    "audit_canaries": "lightning_privacy.audits.canary",
    "CanaryDesign": "lightning_privacy.audits.canary_design",
    "optimize_input_canaries": "lightning_privacy.audits.canary_design",
    "LanguageModelCanaries": "lightning_privacy.audits.lm_canaries",
    "audit_language_model_canaries": "lightning_privacy.audits.lm_canaries",
    "language_model_canaries": "lightning_privacy.audits.lm_canaries",
    "EpsilonStarResult": "lightning_privacy.audits.epsilon_star",
    "audit_epsilon_star": "lightning_privacy.audits.epsilon_star",
    "audit_epsilon_star_from_losses": "lightning_privacy.audits.epsilon_star",
    "PanoramiaAuditResult": "lightning_privacy.audits.panoramia",
    "audit_panoramia": "lightning_privacy.audits.panoramia",
    "PrivacyProfileResult": "lightning_privacy.audits.privacy_profile",
    "audit_privacy_profile": "lightning_privacy.audits.privacy_profile",
    "load_checkpoint": "lightning_privacy.checkpoints",
    "MembershipAuditResult": "lightning_privacy.audits.membership",
    "audit_membership": "lightning_privacy.audits.membership",
}
_MOVED = {"ReferenceModels", "train_references"}  # (here until 0.2.0; they train models, which this layer does not)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in _MOVED:
        raise AttributeError(
            f"lightning_privacy.audits.{name} moved to lightning_privacy.references.{name} in 0.3.0 (training "
            f"reference models needs Lightning and DP-SGD, above the audits layer): "
            f"`from lightning_privacy.references import {name}`."
        )
    raise AttributeError(f"module 'lightning_privacy.audits' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(__all__)
