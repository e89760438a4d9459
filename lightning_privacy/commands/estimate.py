"""``lightning-privacy estimate``: ε from a membership game, as counts or as attack scores with true labels.

**Counts** (``--fn --tp --fp --tn``): the Bayesian (joint posterior), Jeffreys and Clopper-Pearson intervals
of Zanella-Béguelin et al. (2023) side by side, e.g. the paper's worked example::

    lightning-privacy estimate --fn 35 --tp 65 --fp 25 --tn 75 --delta 0.05 --alpha 0.05

**Scores** (``--scores F --labels F``): the threshold attack's lower bound on ε,
:func:`lightning_privacy.analysis.estimation.epsilon_lower_bound` on the two files. The attack calls an
example a member when its score is ≥ a threshold (``--lower-is-member``: ≤, for losses). The threshold is
chosen so that the bound stays valid (``--selection holdout``, the default: chosen on a random half, the
bound computed on the other half; ``bonferroni``: every threshold tested at α / their number; ``none``:
the best of all thresholds, uncorrected, marked optimistic)::

    lightning-privacy estimate --scores scores.npy --labels labels.txt --delta 1e-5

Files are ``.npy`` (no pickles) or text (``.csv``/``.txt``, one value a line, ``#`` comments); labels are
1 (member) or 0 (non-member). ``--json`` prints exactly one JSON object on stdout (strict JSON: a
non-finite value, e.g. the upper end of a one-sided interval, is ``null``).

**δ.** The formula takes any δ in [0, 1), but at ε = 0 (ε, δ)-DP already allows every attack with TPR − FPR ≤ δ:
a game can refute ε > 0 only with error rates confidently below 1 − δ, and no outcome does better than a perfect
attack, whose rates' confidence limits depend on the number of trials. From the δ at which even a perfect attack's
lower limit is 0 (:func:`~lightning_privacy.analysis.estimation.max_informative_delta`; about 0.96 for 100 + 100
trials, 0.68 for 10 + 10, Bayesian two-sided at α = 0.05) every result is 0 whatever the data: such a ``--delta`` is
refused (exit 2), naming the range that can show something. Below it, intervals that are all [0, 0] because δ
exceeds the attack's own TPR − FPR get a warning: a DP claim worth testing has a far smaller δ (≤ 1/n for n
training rows).

When the attack looks reversed — members scoring significantly lower than non-members (one-sided
Mann-Whitney test at :data:`~lightning_privacy.analysis.estimation.REVERSED_LEVEL`), or, for counts, guessed
"member" less often (Fisher's test) — a bound of 0 says nothing: a ``warning:`` line on stderr says so and
how to fix it (``--lower-is-member``), and the JSON has it in its ``"warnings"`` list (empty otherwise).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

NAME = "estimate"
HELP = (
    "Epsilon from a membership game: intervals (Bayesian, Jeffreys, Clopper-Pearson) from counts FN/TP/FP/TN, "
    "or the threshold attack's lower bound from attack scores and true membership labels."
)
METHODS = ("bayes", "jeffreys", "clopper_pearson")
SELECTIONS = ("holdout", "bonferroni", "none")
LABELS = {
    "bayes": "Bayesian (joint posterior)",
    "jeffreys": "Jeffreys rectangle",
    "clopper_pearson": "Clopper-Pearson rectangle",
}
COUNTS = ("fn", "tp", "fp", "tn")
SCORE_ONLY = ("method", "selection", "seed", "lower_is_member")  # options of the scores mode (default None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    counts = parser.add_argument_group("counts of a membership game (all four)")
    counts.add_argument("--fn", type=int, default=None, help="false negatives: members guessed non-member")
    counts.add_argument("--tp", type=int, default=None, help="true positives: members guessed member")
    counts.add_argument("--fp", type=int, default=None, help="false positives: non-members guessed member")
    counts.add_argument("--tn", type=int, default=None, help="true negatives: non-members guessed non-member")
    scores = parser.add_argument_group("or attack scores and true membership (both)")
    scores.add_argument(
        "--scores", default=None, help="attack scores, higher = more likely a member: .npy, or .csv/.txt one a line"
    )
    scores.add_argument("--labels", default=None, help="true membership per score, 1 = member, 0 = non-member")
    scores.add_argument(
        "--lower-is-member",
        action="store_true",
        default=None,
        help="the scores are losses: lower = more likely a member",
    )
    scores.add_argument(
        "--method", choices=METHODS, default=None, help="interval of the bound (default: bayes, the paper's)"
    )
    scores.add_argument(
        "--selection",
        choices=SELECTIONS,
        default=None,
        help="how the threshold is chosen validly: holdout (default), bonferroni, or none (optimistic)",
    )
    scores.add_argument("--seed", type=int, default=None, help="seed of the holdout split (default: 0)")
    parser.add_argument(
        "--delta",
        type=float,
        required=True,
        help="delta of (epsilon, delta)-DP, in [0, 1); refused from where no outcome of the game could show epsilon > 0",
    )
    parser.add_argument(
        "--alpha", type=float, default=0.05, help="significance: 100(1 - alpha)%% intervals (default: %(default)s)"
    )
    parser.add_argument(
        "--sided",
        choices=("two", "one"),
        default="two",
        help="two-sided interval or one-sided lower bound (default: %(default)s)",
    )
    parser.add_argument(
        "--region",
        choices=("attack", "full"),
        default="attack",
        help="privacy region: 'attack' (Equation 1) or 'full' (Definition 3.1 verbatim) (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _check_common(args: argparse.Namespace) -> None:
    if not (isinstance(args.delta, float) and 0.0 <= args.delta < 1.0):
        raise ValueError(f"`--delta` must be in [0, 1), got {args.delta!r}")
    if not 0.0 < args.alpha < 1.0:
        raise ValueError(f"`--alpha` must be in the open interval (0, 1), got {args.alpha!r}")


def _mode(args: argparse.Namespace) -> str:
    """``"counts"`` or ``"scores"``, with one-line errors for mixed or incomplete options."""
    given_counts = [c for c in COUNTS if getattr(args, c) is not None]
    given_files = [f for f in ("scores", "labels") if getattr(args, f) is not None]
    if given_counts and given_files:
        raise ValueError(
            "give either the counts --fn/--tp/--fp/--tn or --scores and --labels, not both "
            f"(got {', '.join(_flag(o) for o in given_counts + given_files)})"
        )
    if given_files:
        missing = {"scores", "labels"} - set(given_files)
        if missing:
            needs = "`--labels` (1 = member, 0 = non-member, one per score)" if "labels" in missing else "`--scores`"
            raise ValueError(f"`{_flag(given_files[0])}` needs {needs}")
        return "scores"
    if not given_counts:
        raise ValueError("give the counts --fn --tp --fp --tn, or --scores F --labels F")
    missing = [_flag(c) for c in COUNTS if c not in given_counts]
    if missing:
        raise ValueError(f"the counts need all of --fn --tp --fp --tn; missing {' '.join(missing)}")
    for c in COUNTS:
        if getattr(args, c) < 0:
            raise ValueError(f"`{_flag(c)}` must be a count >= 0, got {getattr(args, c)}")
    if args.fn + args.tp == 0:
        raise ValueError("`--fn` + `--tp` must be > 0: at least one member trial")
    if args.fp + args.tn == 0:
        raise ValueError("`--fp` + `--tn` must be > 0: at least one non-member trial")
    wrong = [_flag(o) for o in SCORE_ONLY if getattr(args, o, None) is not None]
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: only with --scores/--labels, not with counts")
    return "counts"


def _check_delta_informative(
    args: argparse.Namespace, *, members: int, nonmembers: int, alpha: float, methods: tuple, what: str = "a game"
) -> None:
    """Refuse a ``--delta`` at which no outcome of this game (not even a perfect attack) can show ε > 0."""
    from lightning_privacy.analysis.estimation import epsilon_interval, max_informative_delta

    settings = dict(alpha=alpha, sided=args.sided, region=args.region)
    perfect = dict(fn=0, tp=members, fp=0, tn=nonmembers, delta=args.delta, **settings)
    if any(epsilon_interval(method=method, **perfect)[0] > 0 for method in methods):
        return
    largest = max(
        max_informative_delta(members=members, nonmembers=nonmembers, method=method, **settings) for method in methods
    )
    if largest <= 0:  # even delta = 0 shows nothing: too few trials, not the delta's fault
        return
    raise ValueError(
        f"`--delta` must be in [0, {largest:g}) for {what} of {members} members and {nonmembers} non-members at "
        f"alpha={alpha:.3g} ({args.sided}-sided), got {args.delta:g}: at epsilon = 0, (epsilon, delta)-DP already "
        "allows every attack with TPR - FPR <= delta, and from there on not even a perfect attack (no errors) can "
        "show epsilon > 0 with this many trials, so every lower bound would be 0 whatever the data (a DP claim worth "
        "testing has delta <= 1/n for n training rows)"
    )


def _delta_swallows_the_attack(*, fn: int, tp: int, fp: int, tn: int, delta: float, what: str) -> list:
    """The warning for intervals that are all [0, 0] because δ exceeds the attack's own advantage TPR − FPR."""
    tpr, fpr = tp / (tp + fn), fp / (fp + tn)
    if tpr <= fpr:  # no power, or reversed (warned about separately)
        return []
    return [
        f"{what} [0, 0] at delta={delta:g}: at epsilon = 0, (epsilon, delta)-DP already allows every attack with "
        f"TPR - FPR <= delta, and this attack's TPR - FPR = {tpr - fpr:.3g} is within it, so it refutes no epsilon "
        f"at this delta (the point estimate is above 0 only for delta < {tpr - fpr:.3g}); test the delta of the DP "
        "claim, usually <= 1/n for n training rows"
    ]


def estimate(args: argparse.Namespace) -> dict:
    """The three intervals (and the time each took) for the counts in ``args``, as plain values."""
    from lightning_privacy.analysis.estimation import counts_orientation, epsilon_from_rates, epsilon_interval

    _check_delta_informative(
        args, members=args.fn + args.tp, nonmembers=args.fp + args.tn, alpha=args.alpha, methods=METHODS
    )
    out = {
        "mode": "counts",
        "counts": {"fn": args.fn, "tp": args.tp, "fp": args.fp, "tn": args.tn},
        "delta": args.delta,
        "alpha": args.alpha,
        "sided": args.sided,
        "region": args.region,
        "intervals": {},
    }
    for method in METHODS:
        start = time.perf_counter()
        low, high = epsilon_interval(
            fn=args.fn,
            tp=args.tp,
            fp=args.fp,
            tn=args.tn,
            delta=args.delta,
            alpha=args.alpha,
            method=method,
            sided=args.sided,
            region=args.region,
        )
        out["intervals"][method] = {"low": low, "high": high, "seconds": time.perf_counter() - start}
    out["point_estimate"] = epsilon_from_rates(
        fnr=args.fn / (args.fn + args.tp), fpr=args.fp / (args.fp + args.tn), delta=args.delta, region=args.region
    )
    orientation = counts_orientation(fn=args.fn, tp=args.tp, fp=args.fp, tn=args.tn)
    out["warnings"] = (
        [
            f"the guesses look reversed: members are guessed 'member' less often than non-members (TPR "
            f"{args.tp / (args.tp + args.fn):.3g} < FPR {args.fp / (args.fp + args.tn):.3g}, one-sided Fisher test "
            f"p = {orientation.pvalue:.2g} < {orientation.level:g}); the intervals of this attack say nothing about "
            "privacy: swap its guesses (FN <-> TP and FP <-> TN) if 'member' and 'non-member' were mixed up"
        ]
        if orientation.reversed
        else []
    )
    if all(r["high"] == 0 for r in out["intervals"].values()):
        counts = dict(fn=args.fn, tp=args.tp, fp=args.fp, tn=args.tn)
        out["warnings"] += _delta_swallows_the_attack(**counts, delta=args.delta, what="every interval is")
    return out


def read_scores(scores_path: str, labels_path: str, *, lower_is_member: bool = False) -> tuple:
    """``(scores, is_member)`` from the two files: finite floats (higher = member) and booleans, same length.

    Raises:
        ValueError: a one-line message naming ``--scores`` or ``--labels``, the file and what is wrong.
    """
    import numpy as np

    from lightning_privacy.commands._audit_io import read_values

    scores = read_values(scores_path, "--scores")
    labels = read_values(labels_path, "--labels")
    if scores.size != labels.size:
        raise ValueError(
            f"`--scores` {scores_path!r} holds {scores.size} values but `--labels` {labels_path!r} holds "
            f"{labels.size}: one label per score"
        )
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        raise ValueError(
            f"`--scores` {scores_path!r} must hold finite numbers; value {bad[0] + 1} is {float(scores[bad[0]])!r}"
        )
    odd = np.flatnonzero((labels != 0) & (labels != 1))
    if odd.size:
        raise ValueError(
            f"`--labels` {labels_path!r} must hold 1 (member) or 0 (non-member); value {odd[0] + 1} is "
            f"{float(labels[odd[0]])!r}"
        )
    is_member = labels == 1
    return (-scores if lower_is_member else scores), is_member


def estimate_from_scores(args: argparse.Namespace) -> dict:
    """The threshold attack's lower bound on ε for the files in ``args``, as plain values."""
    import numpy as np

    from lightning_privacy.analysis.estimation import epsilon_from_rates, epsilon_lower_bound, score_orientation

    lower_is_member = bool(args.lower_is_member)
    selection = args.selection or "holdout"
    scores, is_member = read_scores(args.scores, args.labels, lower_is_member=lower_is_member)
    members, nonmembers = int(is_member.sum()), int((~is_member).sum())
    need = 2 if selection == "holdout" else 1
    if members < need or nonmembers < need:
        raise ValueError(
            f"`--labels` {args.labels!r} has {members} members (1) and {nonmembers} non-members (0); "
            f"--selection {selection} needs at least {need} of each"
        )
    if selection == "holdout":  # the bound's own game: the held-out half (the rest of each class), at alpha
        game = dict(members=members - members // 2, nonmembers=nonmembers - nonmembers // 2, alpha=args.alpha)
    else:  # all of it; Bonferroni tests each of the distinct scores + 1 thresholds at alpha / their number
        tested = len(np.unique(scores)) + 1 if selection == "bonferroni" else 1
        game = dict(members=members, nonmembers=nonmembers, alpha=args.alpha / tested)
    what = "the held-out half" if selection == "holdout" else "a game"
    _check_delta_informative(args, **game, methods=(args.method or "bayes",), what=what)
    start = time.perf_counter()
    res = epsilon_lower_bound(
        scores,
        is_member,
        delta=args.delta,
        alpha=args.alpha,
        method=args.method or "bayes",
        selection=selection,
        sided=args.sided,
        region=args.region,
        seed=0 if args.seed is None else args.seed,
    )
    seconds = time.perf_counter() - start
    out = {
        "mode": "scores",
        "scores": args.scores,
        "labels": args.labels,
        "num_members": members,
        "num_nonmembers": nonmembers,
        **res.as_dict(),
        "sided": args.sided,
        "region": args.region,
        "seed": 0 if args.seed is None else args.seed,
        "lower_is_member": lower_is_member,
    }
    # the rule in the files' own units: "member iff score >= t" (or "loss <= t" with --lower-is-member)
    out["threshold"] = -res.threshold if lower_is_member else res.threshold
    out["rule"] = f"member iff score {'<=' if lower_is_member else '>='} threshold"
    out["point_estimate"] = epsilon_from_rates(
        fnr=res.fn / (res.fn + res.tp), fpr=res.fp / (res.fp + res.tn), delta=args.delta, region=args.region
    )
    out["seconds"] = seconds
    out["warnings"] = []
    orientation = score_orientation(scores, is_member)  # the bound's own test, worded for the files' units
    if orientation.reversed and lower_is_member:
        fix = "if higher values in the file mean member, drop `--lower-is-member`"
        out["warnings"].append("with `--lower-is-member`, " + orientation.warning(fix))
    elif orientation.reversed:
        out["warnings"].append(orientation.warning("if lower means member (e.g. losses), pass `--lower-is-member`"))
    if res.interval_high == 0:
        counts = dict(fn=res.fn, tp=res.tp, fp=res.fp, tn=res.tn)
        out["warnings"] += _delta_swallows_the_attack(**counts, delta=args.delta, what="the interval is")
    return out


def _table(result: dict) -> str:
    level = 100 * (1 - result["alpha"])
    c = result["counts"]
    lines = [
        f"FN={c['fn']} TP={c['tp']} FP={c['fp']} TN={c['tn']}  delta={result['delta']:g}  "
        f"{level:g}% {result['sided']}-sided  point estimate {result['point_estimate']:.3f}",
        f"{'method':<28}{'eps_lower':>10}{'eps_upper':>10}{'width':>8}{'ms':>9}",
    ]
    for method, r in result["intervals"].items():
        width = r["high"] - r["low"]
        lines.append(f"{LABELS[method]:<28}{r['low']:>10.3f}{r['high']:>10.3f}{width:>8.3f}{1e3 * r['seconds']:>9.1f}")
    return "\n".join(lines)


def _scores_table(r: dict) -> str:
    level = 100 * (1 - r["alpha"])
    held_out = " (held-out half)" if r["selection"] == "holdout" else ""
    per_test = f", each at alpha = {r['alpha_per_test']:.3g}" if r["selection"] == "bonferroni" else ""
    op = "<=" if r["lower_is_member"] else ">="
    rows = [
        ("members / non-members", f"{r['num_members']} / {r['num_nonmembers']}"),
        ("delta", f"{r['delta']:g}"),
        (
            "epsilon lower bound",
            f"{r['epsilon_lower']:.4f}   ({level:g}% {r['sided']}-sided, {LABELS[r['method']]})",
        ),
        ("interval for eps_hat", f"[{r['interval_low']:.4f}, {r['interval_high']:.4f}]"),
        ("threshold", f"member iff score {op} {r['threshold']:.6g}"),
        (
            f"confusion matrix{held_out}",
            f"TP={r['tp']} FP={r['fp']} TN={r['tn']} FN={r['fn']}  point estimate {r['point_estimate']:.4f}",
        ),
        ("threshold selection", f"{r['selection']} over {r['n_thresholds']} thresholds{per_test}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if r["optimistic"]:
        lines.append(
            "warning: --selection none reports the best of many tests without correction: the level does not hold "
            "for it (optimistic; use holdout or bonferroni for a valid bound)"
        )
    elif r["epsilon_lower"] == 0:
        lines.append("the attack refutes no epsilon > 0 at this level (a bound of 0 says nothing about privacy)")
    return "\n".join(lines)


def _strict(value):
    """``value`` for strict JSON: non-finite floats become ``None``."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run(args: argparse.Namespace) -> int:
    try:
        _check_common(args)
        mode = _mode(args)
        result = estimate(args) if mode == "counts" else estimate_from_scores(args)
    except (TypeError, ValueError) as err:
        print(f"lightning-privacy estimate: error: {err}", file=sys.stderr)
        return 2
    for warning in result["warnings"]:
        print(f"lightning-privacy estimate: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(_strict(result), allow_nan=False))
    else:
        print(_table(result) if mode == "counts" else _scores_table(result))
    return 0
