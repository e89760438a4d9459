"""A model's privacy statement for release: from a checkpoint alone, as JSON and as a model card's Markdown section.

:func:`privacy_statement` reads what a release check asks of a model trained with :class:`~lightning_privacy.DPSGD`
from a Lightning checkpoint (no model class needed: the file is read with ``torch.load(weights_only=True)`` and only
the callbacks' saved states are used) or from a Trainer after ``fit``:

- the mechanism: σ, the sample rate q and whether it was given, the steps, the clipping norm C, the divisor of the
  noised sum, δ, the accountant, the relation of each value, whether the batches' sampling and the noise were secret,
  the per-example gradient mode, the strategy and the training set size;
- whether the DPSGD state is consistent: σ, q and C agree with the ledger's history and the state's key, the ledger's
  steps with the checkpoint's ``global_step``, and the state with the digest saved beside it
  (:mod:`~lightning_privacy.statement.consistency`); an inconsistent state gets no guarantee;
- the guarantee: the accountant's ε at δ, the safe β*_MIA and the TPR bounds at FPR 0.001, 0.01 and 0.1 of any
  membership attack, computed by the run's :class:`~lightning_privacy.ledger.PrivacyLedger` rebuilt from the saved
  state (:func:`lightning_privacy.checkpoints.privacy_ledger`), so they equal the run's own values;
- the audits whose results the source holds, their values and their verdicts on the claims they tested;
- the versions of lightning-privacy, torch, Opacus and Lightning, and what the numbers do not cover (telemetry, data
  used outside DP-SGD, what is treated as public, approximations).

A checkpoint without a DPSGD state gives a statement that says so and states no ε, β* or TPR bound; so does one whose
DPSGD state took no step. A malformed field (the wrong type, not finite, out of range) is a ``ValueError`` naming the
field and its value (:mod:`~lightning_privacy.statement.fields`). The result, a :class:`PrivacyStatement`, renders as
JSON (:meth:`PrivacyStatement.to_json`, stable keys, ``format_version``), as a Markdown section for a Hugging Face
model card with its YAML metadata block (:meth:`PrivacyStatement.to_markdown`), as text (``lightning-privacy
statement CHECKPOINT``) and as the privacy report's last section (:meth:`PrivacyStatement.report_section`,
:mod:`lightning_privacy.report`). The JSON holds the computed values; the Markdown and the report round them toward
the safe side (ε and TPR bounds up, β* down).

The modules: :mod:`~lightning_privacy.statement.reading` (the file), :mod:`~lightning_privacy.statement.fields` (the
checks of each field), :mod:`~lightning_privacy.statement.consistency` (the checks across fields),
:mod:`~lightning_privacy.statement.build` (the values), :mod:`~lightning_privacy.statement.records` (the budget and
the audits), :mod:`~lightning_privacy.statement.sentences` (summary, what is not covered, approximations),
:mod:`~lightning_privacy.statement.rendering` and :mod:`~lightning_privacy.statement.document` (the renderings).

Example::

    >>> statement = privacy_statement("final.ckpt")  # doctest: +SKIP
    >>> statement.epsilon, statement.to_dict()["guarantee"]["bayes_security"]  # doctest: +SKIP
    (0.559..., 0.9000...)
    >>> print(statement.to_markdown())  # doctest: +SKIP
"""

from lightning_privacy.statement.build import privacy_statement
from lightning_privacy.statement.document import PrivacyStatement
from lightning_privacy.statement.fields import FORMAT, FORMAT_VERSION, FPRS
from lightning_privacy.statement.reading import read_checkpoint

__all__ = ["FORMAT", "FORMAT_VERSION", "FPRS", "PrivacyStatement", "privacy_statement", "read_checkpoint"]
