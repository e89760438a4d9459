"""Sensitive attributes for attribute inference: see :mod:`lightning_privacy.attributes` (their one home).

A :class:`~lightning_privacy.attributes.SensitiveAttribute` describes data (which input columns hold the attribute
and which values it can take), so the data modules, the functional layer and the callbacks all use it; it lives at
the package root, beside ``names.py``, and this module re-exports it for the functional API.
"""

from lightning_privacy.attributes import KINDS, SensitiveAttribute, check_candidates, observed_values

__all__ = ["SensitiveAttribute", "KINDS", "observed_values", "check_candidates"]
