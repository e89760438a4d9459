"""``lightning-privacy estimate``: intervals for ε from a membership game's confusion matrix.

Prints the Bayesian (joint posterior), Jeffreys and Clopper-Pearson intervals of Zanella-Béguelin et
al. (2023) side by side, e.g. the paper's worked example::

    lightning-privacy estimate --fn 35 --tp 65 --fp 25 --tn 75 --delta 0.05 --alpha 0.05
"""

from __future__ import annotations

import argparse
import json
import sys
import time

NAME = "estimate"
HELP = "Intervals for epsilon (Bayesian, Jeffreys, Clopper-Pearson) from membership-inference counts FN/TP/FP/TN."
METHODS = ("bayes", "jeffreys", "clopper_pearson")
LABELS = {
    "bayes": "Bayesian (joint posterior)",
    "jeffreys": "Jeffreys rectangle",
    "clopper_pearson": "Clopper-Pearson rectangle",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fn", type=int, required=True, help="false negatives: members guessed non-member")
    parser.add_argument("--tp", type=int, required=True, help="true positives: members guessed member")
    parser.add_argument("--fp", type=int, required=True, help="false positives: non-members guessed member")
    parser.add_argument("--tn", type=int, required=True, help="true negatives: non-members guessed non-member")
    parser.add_argument("--delta", type=float, required=True, help="delta of (epsilon, delta)-DP, in [0, 1)")
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


def estimate(args: argparse.Namespace) -> dict:
    """The three intervals (and the time each took) for the counts in ``args``, as plain values."""
    from lightning_privacy.analysis.estimation import epsilon_from_rates, epsilon_interval

    out = {
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


def run(args: argparse.Namespace) -> int:
    try:
        result = estimate(args)
    except (TypeError, ValueError) as err:
        print(f"lightning-privacy estimate: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(_table(result))
    return 0
