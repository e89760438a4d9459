"""A statement's sentences: its summary, what its numbers do not cover (and what they treat as public), and which
values are bounds or approximations."""

from __future__ import annotations

from typing import List

from lightning_privacy.dpsgd.state import NOT_RECORDED
from lightning_privacy.ledger import accountant_label
from lightning_privacy.reporting import down, up
from lightning_privacy.statement.fields import RELATION_LABELS

__all__ = ["approximations", "not_covered", "summary"]


def _stated(data: dict) -> bool:
    """Whether the statement states a guarantee: a consistent DPSGD state with at least one step."""
    return bool(data["differentially_private"])


def summary(data: dict) -> str:
    """One paragraph: the guarantee, or why there is none."""
    mechanism, guarantee = data["mechanism"], data["guarantee"]
    consistency = data.get("consistency") or {}
    if mechanism is None and consistency.get("status") == "inconsistent":
        problems = consistency["problems"]
        return (
            f"Inconsistent: {problems[0]}"
            + (f" (and {len(problems) - 1} more problem(s), listed under consistency)" if len(problems) > 1 else "")
            + ". lightning-privacy states no differential-privacy guarantee for this model (no ε, β*_MIA or TPR bound)."
        )
    if mechanism is None:
        return (
            "No DP-SGD: the source holds no DPSGD state, so lightning-privacy states no differential-privacy guarantee "
            "for this model (no ε, β*_MIA or TPR bound)."
        )
    if consistency.get("status") == "inconsistent":
        problems = consistency["problems"]
        what = (
            "Audits and DP-SGD state disagree"
            if problems[0] in consistency.get("audit_problems", [])
            else ("Inconsistent DP-SGD state")
        )
        return (
            f"{what}: {problems[0]}"
            + (f" (and {len(problems) - 1} more problem(s), listed under consistency)" if len(problems) > 1 else "")
            + ". The values do not describe one run, so lightning-privacy states no differential-privacy guarantee "
            "for this model (no ε, β*_MIA or TPR bound)."
        )
    if not mechanism["steps"]:
        return (
            "No DP-SGD step recorded: the DPSGD state holds no step (saved before training?), so no privacy was spent "
            "and nothing is stated about a trained model."
        )
    eps = guarantee["epsilon"]
    epsilon = "no finite ε" if eps is None else f"(ε = {up(eps)}, δ = {guarantee['delta']:g})-DP"
    label = accountant_label(mechanism["accountant"]).replace(" (add/remove)", "")
    return (
        f"Trained with DP-SGD: {epsilon} for one training example added or removed ({label}), after "
        f"{mechanism['steps']} steps at noise multiplier σ = {mechanism['noise_multiplier']:g} and sample rate "
        f"q = {mechanism['sample_rate']:.6g}; any membership attacker's Bayes security β*_MIA ≥ "
        f"{down(guarantee['bayes_security'])} ({RELATION_LABELS[guarantee['bayes_security_relation']]})."
    )


def _public(mechanism: dict) -> List[str]:
    """What the guarantee treats as public: q's source, the divisor of the noised sum, N shown in the statement."""
    out = []
    given = mechanism.get("sample_rate_given")
    if given is True:
        out.append(
            "q was given (`DPSGD(sample_rate=...)`), not computed from the training set; the number of steps T is "
            "shown and so public (fixed by `Trainer(max_steps=...)` it does not depend on the training set either)."
        )
    elif given is None:
        out.append(
            "Whether q was given (`DPSGD(sample_rate=...)`) or is 1/len(train loader) is not recorded (saved by an "
            "older version); if the latter, the number of batches per epoch is treated as public: ε covers adding or "
            "removing one example among training sets with the same number of batches per epoch."
        )
    else:
        drop_last = "drop_last" in str(mechanism.get("sample_rate_origin") or "")
        batches = "1/⌊N/batch size⌋ (the train loader had drop_last=True)" if drop_last else "1/⌈N/batch size⌉"
        out.append(
            f"q = 1/len(train loader) = {batches}: the number of batches per epoch is treated as public, so ε "
            "covers adding or removing one example among training sets with the same number of batches per epoch; "
            "`DPSGD(sample_rate=...)` fixes q without the training set's size."
        )
    if mechanism.get("expected_batch_size") is None:
        out.append(
            "The divisor of each step's noised sum is not recorded (saved by an older version): versions that did "
            "not record it divided by int(N·q), computed from the private training set size, so the noise's scale in "
            "the weights can differ between a training set and the same set with one example fewer — a difference "
            "ε does not bound."
        )
    if mechanism.get("dataset_size") is not None:
        out.append(
            f"The statement shows the training set size N = {mechanism['dataset_size']}: published with the model, "
            "N tells a training set from the same set with one example more or fewer, which ε does not cover; leave "
            "`dataset_size` out of what you publish if N is private."
        )
    return out


def _precision(mechanism: dict) -> List[str]:
    """Steps whose clipped sum bounded each example by C only up to 16-bit rounding, or that nobody recorded it."""
    record = mechanism.get("precision")
    out = []
    if record is None or str(record.get("precision")).startswith(NOT_RECORDED):  # (a resume of an older checkpoint)
        out.append(
            f"The training precision {'is' if record is None else 'of the steps before a resume is'} not recorded "
            "(saved by an older version): under 16-bit precision (bf16, fp16) each example's contribution to a step "
            "may be bounded by C only up to 16-bit rounding, which ε does not account for."
        )
    rounded = (record or {}).get("rounded_steps") or 0
    if not rounded:
        return out
    return out + [
        f"{rounded} of the {mechanism['steps']} steps (ghost clipping, precision {record.get('precision')!r}) took "
        "the norms or the clipped sum from 16-bit products: on them each example's contribution is bounded by C only "
        "up to 16-bit rounding (about 2⁻⁸ of it, bfloat16's unit roundoff), which ε does not account for; "
        "grad_sample_mode='hooks' or 'functional' (or ghost clipping of Linear, Conv1D, Embedding and LayerNorm "
        "layers under bf16-mixed) clips exactly what is summed."
    ]


def not_covered(data: dict, notes: List[str], *, live: bool) -> List[str]:
    """What the numbers do not cover (and what they treat as public), one sentence each."""
    mechanism = data["mechanism"]
    out = list(notes)
    if not _stated(data):
        out.append(
            "Nothing bounds what the model reveals about its training data: audit results, if any, are lower bounds "
            "or estimates of leakage, never a guarantee."
        )
    else:
        out += [
            "The guarantee is per training example, not per person: someone with k rows in the training set is "
            "protected only at about k·ε (group privacy).",
            "Only the DP-SGD steps are accounted: data used outside them (pre-training, preprocessing statistics "
            "fitted on the training set, validation and test sets, hyperparameter tuning and model selection on "
            "private data, earlier or repeated runs) is not.",
            *_public(mechanism),
        ]
        for field, what in (("sampling_seed", "batches' Poisson sampling"), ("noise_seed", "noise")):
            if mechanism[field] == "fixed":
                out.append(
                    f"The {what} came from a fixed seed: the guarantee holds only against an adversary who does not "
                    "know it (fixed seeds are for tests and debugging)."
                )
        if mechanism["secure_mode"] is None:
            out.append(
                "Whether DPSGD ran with `secure_mode` is not recorded in the checkpoint; without it the noise is "
                "floating-point Gaussian samples from a pseudo-random generator, and floating-point attacks on the "
                "noise (Mironov 2012) are not excluded."
            )
        elif not mechanism["secure_mode"]:
            out.append(
                "DPSGD ran without `secure_mode`: the noise is floating-point Gaussian samples from a pseudo-random "
                "generator, and floating-point attacks on the noise (Mironov 2012) are not excluded."
            )
        if mechanism["strategy"] is None:
            out.append("The strategy (one device, DDP, FSDP2) is not recorded in the checkpoint.")
        out += _precision(mechanism)
        out.append(
            "The statement checks that the DPSGD state agrees with its ledger, its key and the checkpoint's "
            "global_step"
            + (
                " and with the digest saved beside it"
                if data["consistency"]["digest"] == "verified"
                else " (it carries no digest: saved by an older version)"
            )
            + "; a state rewritten consistently by hand — σ, the history, the key and the digest together — "
            "passes every check: the statement is only as trustworthy as the file's origin."
        )
    out.append(
        "Telemetry and audit results are computed from the private data outside the DP mechanism and are not "
        "covered by ε: clipping statistics (`dp/clip_fraction`, `dp/grad_norm_median`, `dp/grad_norms`), "
        "attribute sensitivities (`privacy/ai_sensitivity`), membership-audit and canary scores and their metrics."
    )
    if not live:
        out.append(
            "A checkpoint holds the results of the audits that save them (MembershipAudit, CanaryAudit, "
            "PanoramiaAudit) as of when it was saved: an audit at fit end is in a checkpoint saved after fit "
            "(`trainer.save_checkpoint`), not in one ModelCheckpoint saved during it; EpsilonStarAudit and "
            "PrivacyProfileAudit save none (see the privacy report)."
        )
        if any(a["verdict"] is not None for a in data["audits"]):
            out.append(
                "The checkpoint records each verdict, not the claim it tested: by default an audit tests the run's "
                "own DP-SGD guarantee at the time of the audit, else the `claim=` given to it."
            )
    return out


def approximations(data: dict) -> List[str]:
    """Which values are bounds, which approximations, and how the Markdown rounds."""
    mechanism = data["mechanism"]
    out = []
    if _stated(data):
        accountant = mechanism["accountant"]
        if accountant == "pld":
            out.append(
                "ε is the certified upper bound of the pessimistic privacy-loss distribution (add/remove) that β*_MIA "
                "and the TPR bounds also come from: one accountant for every number here."
            )
        elif accountant == "rdp":
            out.append(
                "ε is Opacus' RDP accountant's upper bound; its conversion to (ε, δ) is loose, so the true ε is lower."
            )
        elif accountant == "prv":
            out.append("ε is the upper end of Opacus' PRV accountant's error-bounded estimate.")
        elif accountant == "gdp":
            out.append(
                "ε is Opacus' GDP accountant's central-limit approximation: NOT an upper bound (it can understate ε, "
                "and it reads only the last segment of the history). β*_MIA and the TPR bounds are certified."
            )
        out += [
            "β*_MIA and the TPR bounds come from a pessimistic discretisation of the privacy-loss distribution of the "
            "recorded history: certified (β* never above, a TPR bound never below the exact value).",
            "β*_MIA closed form (Cherubin et al. 2024, Cor. 7) is an approximation, shown for comparison only; it can "
            "overstate security.",
        ]
        if len({(s, p) for s, p, _ in mechanism["history"]}) > 1:
            out.append(
                f"σ or q changed during training ({len(mechanism['history'])} segments): the values above are the "
                "last segment's; ε, β* and the TPR bounds compose every segment."
            )
    if data["audits"]:
        out.append(
            "Audit ε lower bounds hold at their confidence; estimates (Epsilon*, PANORAMIA's ε̃, AUC and TPR of an "
            "attack) carry no guarantee either way."
        )
    out.append(
        "The Markdown and the report round ε, the advantage and the TPR bounds up and β* down; the JSON holds the "
        "computed values."
    )
    return out
