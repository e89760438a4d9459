"""lightning_privacy: measurable privacy risk inside PyTorch Lightning training.

The callbacks, the audit functions of :mod:`lightning_privacy.audits` (``audit_membership``, ``audit_epsilon_star``,
...), :func:`~lightning_privacy.references.train_references`, :func:`~lightning_privacy.checkpoints.load_checkpoint`
and :func:`~lightning_privacy.statement.privacy_statement` are re-exported here lazily, so
``import lightning_privacy.analysis`` stays free of torch and lightning.
"""

from importlib import import_module
from typing import Any

__version__ = "0.2.0"

_CALLBACKS = {
    "DPSGD": "lightning_privacy.callbacks.dpsgd",
    "BayesSecurityMonitor": "lightning_privacy.callbacks.bayes_security_monitor",
    "AttributeInferenceMonitor": "lightning_privacy.callbacks.attribute_inference_monitor",
    "PrivacyBudgetStopping": "lightning_privacy.callbacks.privacy_budget_stopping",
    "EpsilonStarAudit": "lightning_privacy.callbacks.epsilon_star_audit",
    "PanoramiaAudit": "lightning_privacy.callbacks.panoramia_audit",
    "PrivacyProfileAudit": "lightning_privacy.callbacks.privacy_profile_audit",
    "OutputPerturbation": "lightning_privacy.callbacks.output_perturbation",
    "CanaryAudit": "lightning_privacy.callbacks.canary_audit",
    "MembershipAudit": "lightning_privacy.callbacks.membership_audit",
}

_FUNCTIONS = {
    "privacy_statement": "lightning_privacy.statement",
    # the audits, as plain functions over a trained model and its data (lightning_privacy.audits)
    "audit_canaries": "lightning_privacy.audits.canary",
    "audit_epsilon_star": "lightning_privacy.audits.epsilon_star",
    "audit_epsilon_star_from_losses": "lightning_privacy.audits.epsilon_star",
    "audit_language_model_canaries": "lightning_privacy.audits.lm_canaries",
    "audit_membership": "lightning_privacy.audits.membership",
    "audit_panoramia": "lightning_privacy.audits.panoramia",
    "audit_privacy_profile": "lightning_privacy.audits.privacy_profile",
    "language_model_canaries": "lightning_privacy.audits.lm_canaries",
    "optimize_input_canaries": "lightning_privacy.audits.canary_design",
    "load_checkpoint": "lightning_privacy.checkpoints",
    "train_references": "lightning_privacy.references",
}

__all__ = ["__version__", *_CALLBACKS, *_FUNCTIONS]


def __getattr__(name: str) -> Any:
    if name in _CALLBACKS:
        return getattr(import_module(_CALLBACKS[name]), name)
    if name in _FUNCTIONS:
        return getattr(import_module(_FUNCTIONS[name]), name)
    raise AttributeError(f"module 'lightning_privacy' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(__all__)
