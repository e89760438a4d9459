"""Benchmark of :mod:`lightning_privacy.analysis.estimation` against the paper and the authors' package.

Zanella-Béguelin et al., "Bayesian Estimation of Differential Privacy" (ICML 2023).

(i)   Worked example (Section 3.2): FN=35, TP=65, FP=25, TN=75, δ=0.05, 95%. Our three intervals and
      timings beside the authors' ``privacy-estimates`` (PyPI; benchmark-only, not a dependency:
      ``pip install privacy-estimates``), whose joint-beta path is run once (it takes seconds).
      ``--verify`` also evaluates the authors' own CDF (dblquad, epsabs 1e-7) at both answers'
      endpoints, to show which endpoint is where F = 0.025 / 0.975 (adds ~40 s).
(ii)  Figure 4: an attack with FPR = FNR = 0.4, 90%, δ = 1e-5: the number of trials each method needs
      for an interval inside ε̂ ± 0.15 (paper: ~1500 Clopper-Pearson, just over 500 Bayesian).
(iii) Figure 5: 1000 trials, FPR × FNR grid, 90%, δ = 1e-5: width reduction of the Bayesian interval vs
      Jeffreys and vs Clopper-Pearson (paper: 20–32% and 36–52%).
(iv)  Threshold selection (Section 4 + our correction): an attack with no power (scores independent of
      membership, true ε̂ = 0), how often each selection claims ε̂₋ > 0; plus the full-region Bayesian
      lower limit, which claims leakage almost always.

Run: ``python benchmarks/estimation.py`` (about a minute plus the authors' ~10–20 s call). With ``--output`` the
published tables (i)–(iv) are written with the command that produced them: ``benchmarks/results/estimation.md``,
embedded in the docs by ``benchmarks/sync_results.py``::

    python benchmarks/estimation.py --verify --output benchmarks/results/estimation.md
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from lightning_privacy.analysis.estimation import epsilon_from_rates, epsilon_interval, epsilon_lower_bound

METHODS = ("bayes", "jeffreys", "clopper_pearson")
WORKED = dict(fn=35, tp=65, fp=25, tn=75)
PAPER = {"bayes": (0.522, 1.268), "jeffreys": (0.321, 1.456), "clopper_pearson": (0.295, 1.489)}
THEIRS = {"bayes": "joint-beta", "jeffreys": "jeffreys", "clopper_pearson": "beta"}
LABEL = {"bayes": "Bayesian", "jeffreys": "Jeffreys", "clopper_pearson": "Clopper-Pearson"}
RESULTS: dict = {}  # what each part measured, for --output


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worked_example(verify: bool) -> None:
    print("(i) Worked example, Section 3.2: FN=35 TP=65 FP=25 TN=75, delta=0.05, 95% two-sided")
    ours = {m: epsilon_interval(**WORKED, delta=0.05, alpha=0.05, method=m) for m in METHODS}
    ours_t = {
        m: _median_seconds(lambda m=m: epsilon_interval(**WORKED, delta=0.05, alpha=0.05, method=m), 20)
        for m in METHODS
    }
    try:
        import privacy_estimates
        from privacy_estimates import AttackResults
    except ImportError:
        privacy_estimates = None
        print("    privacy-estimates not installed: pip install privacy-estimates (authors' columns left empty)")
    theirs, theirs_t = {}, {}
    if privacy_estimates is not None:
        count = AttackResults(FN=35, FP=25, TN=75, TP=65)
        for m in METHODS:
            start = time.perf_counter()
            lo, hi = privacy_estimates.compute_eps_lo_hi(count=count, delta=0.05, alpha=0.05, method=THEIRS[m])
            theirs_t[m] = time.perf_counter() - start
            theirs[m] = (float(lo), float(hi))
    print(
        f"    {'method':<16}{'paper':>16}{'ours':>18}{'ours ms':>10}{'privacy-estimates':>20}{'theirs ms':>11}{'ratio':>9}"
    )
    for m in METHODS:
        p, o = PAPER[m], ours[m]
        t = theirs.get(m)
        t_str = f"[{t[0]:.4f}, {t[1]:.4f}]" if t else "-"
        ratio = f"{theirs_t[m] / ours_t[m]:.0f}x" if t else "-"
        t_ms = f"{1e3 * theirs_t[m]:.1f}" if t else "-"
        print(
            f"    {m:<16}{f'[{p[0]:.3f}, {p[1]:.3f}]':>16}{f'[{o[0]:.4f}, {o[1]:.4f}]':>18}"
            f"{1e3 * ours_t[m]:>10.2f}{t_str:>20}{t_ms:>11}{ratio:>9}"
        )
    if theirs:
        diff = max(abs(a - b) for a, b in zip(ours["bayes"], theirs["bayes"]))
        print(
            f"    Bayesian: largest endpoint difference ours vs privacy-estimates = {diff:.4f} "
            "(their root finder uses xtol=1e-2, dblquad epsabs=5e-3)"
        )
    cdf = {}
    if verify and privacy_estimates is not None:
        from privacy_estimates.joint_density import Beta

        model = Beta(count)
        print("    authors' CDF (dblquad, epsabs=1e-7) at each endpoint (target 0.025 / 0.975):")
        for who, (lo, hi) in (("ours", ours["bayes"]), ("privacy-estimates", theirs["bayes"])):
            f_lo = model.probability_private(eps=lo, delta=0.05, epsabs=1e-7)
            f_hi = model.probability_private(eps=hi, delta=0.05, epsabs=1e-7)
            cdf[who] = (hi, f_hi)
            print(f"      {who:<18} F({lo:.5f}) = {f_lo:.6f}   F({hi:.5f}) = {f_hi:.6f}")
    RESULTS["worked"] = dict(ours=ours, ours_t=ours_t, theirs=theirs, theirs_t=theirs_t, cdf=cdf)
    print()


def _counts(rate_fn: float, rate_fp: float, per_class: int) -> dict:
    fn, fp = round(rate_fn * per_class), round(rate_fp * per_class)
    return dict(fn=fn, tp=per_class - fn, fp=fp, tn=per_class - fp)


def figure_4(delta: float) -> None:
    print(
        f"(ii) Figure 4: FPR = FNR = 0.4, 90% two-sided, delta={delta:g}; trials (members + non-members, "
        "half each) for an interval inside eps_hat +/- 0.15"
    )
    true_eps = epsilon_from_rates(fnr=0.4, fpr=0.4, delta=delta)
    paper = {"bayes": "just over 500", "jeffreys": "slightly < 1500", "clopper_pearson": "~1500"}
    RESULTS["figure_4"] = {}
    print(f"    eps_hat at the true rates = {true_eps:.4f}")
    print(f"    {'method':<16}{'paper':>18}{'ours: band':>12}{'ours: width<=0.3':>18}")
    for m in METHODS:
        first_band = first_width = None
        for per_class in range(50, 1501, 5):  # steps of 10 trials
            lo, hi = epsilon_interval(**_counts(0.4, 0.4, per_class), delta=delta, alpha=0.1, method=m)
            if first_width is None and hi - lo <= 0.3:
                first_width = 2 * per_class
            if first_band is None and lo >= true_eps - 0.15 and hi <= true_eps + 0.15:
                first_band = 2 * per_class
            if first_band and first_width:
                break
        print(f"    {m:<16}{paper[m]:>18}{str(first_band):>12}{str(first_width):>18}")
        RESULTS["figure_4"][m] = (first_band, first_width)
    print()


def figure_5(delta: float, trials: int) -> None:
    per_class = trials // 2
    grid = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
    print(
        f"(iii) Figure 5: {trials} trials ({per_class} per class), 90% two-sided, delta={delta:g}; width reduction "
        "of the Bayesian interval, % vs Jeffreys / % vs Clopper-Pearson (rows FPR, columns FNR)"
    )
    print("    " + "FPR\\FNR".ljust(8) + "".join(f"{g:>9}" for g in grid))
    vs_j, vs_cp, cp_wider = [], [], []
    for fpr in grid:
        row = []
        for fnr in grid:
            c = _counts(fnr, fpr, per_class)
            w = {
                m: (lambda iv: iv[1] - iv[0])(epsilon_interval(**c, delta=delta, alpha=0.1, method=m)) for m in METHODS
            }
            rj, rc = 1 - w["bayes"] / w["jeffreys"], 1 - w["bayes"] / w["clopper_pearson"]
            vs_j.append(rj)
            vs_cp.append(rc)
            cp_wider.append(w["clopper_pearson"] / w["jeffreys"] - 1)
            row.append(f"{100 * rj:>4.0f}/{100 * rc:<4.0f}")
        print(f"    {fpr:<8}" + "".join(f"{r:>9}" for r in row))
    print(
        f"    range vs Jeffreys: {100 * min(vs_j):.0f}-{100 * max(vs_j):.0f}% (paper 20-32%); "
        f"vs Clopper-Pearson: {100 * min(vs_cp):.0f}-{100 * max(vs_cp):.0f}% (paper 36-52%)"
    )
    print(f"    Clopper-Pearson wider than Jeffreys by {100 * min(cp_wider):.0f}-{100 * max(cp_wider):.0f}%")
    RESULTS["figure_5"] = dict(trials=trials, vs_j=vs_j, vs_cp=vs_cp, cp_wider=cp_wider)
    print()


def selection(reps: int) -> None:
    n, alpha, delta = 100, 0.05, 1e-5
    print(
        f"(iv) Attack without power: {n} members + {n} non-members, scores ~ N(0,1) for both, delta={delta:g}, "
        f"alpha={alpha}, Bayesian, {reps} repetitions: share of runs claiming eps_lower > 0 (nominal <= alpha)"
    )
    rng = np.random.default_rng(1)
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    cases = [("holdout", "attack"), ("bonferroni", "attack"), ("none", "attack"), ("holdout", "full")]
    claims = {case: 0 for case in cases}
    seconds = {case: 0.0 for case in cases}
    for rep in range(reps):
        scores = rng.normal(size=2 * n)
        for sel, region in cases:
            start = time.perf_counter()
            res = epsilon_lower_bound(scores, member, delta=delta, alpha=alpha, selection=sel, region=region, seed=rep)
            seconds[(sel, region)] += time.perf_counter() - start
            claims[(sel, region)] += res.epsilon_lower > 0
    RESULTS["selection"] = dict(reps=reps, claims={case: claims[case] / reps for case in cases})
    print(f"    {'selection':<12}{'region':<8}{'false claims':>14}{'ms/call':>9}")
    for sel, region in cases:
        print(
            f"    {sel:<12}{region:<8}{claims[(sel, region)] / reps:>14.3f}{1e3 * seconds[(sel, region)] / reps:>9.1f}"
        )
    print()


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    ms = 1e3 * seconds
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def _range(values: list) -> str:
    return f"{100 * min(values):.0f}–{100 * max(values):.0f}%"


def published(seconds: float, command: str) -> str:
    """The page's tables (i)–(iv) from RESULTS, with the command that wrote them."""
    w = RESULTS["worked"]
    lines = [
        "| (i) Worked example, 95% | paper | ours | privacy-estimates | time ours / theirs |",
        "|---|---|---|---|---|",
    ]
    for m in METHODS:
        p, o, t = PAPER[m], w["ours"][m], w["theirs"].get(m)
        theirs = f"[{t[0]:.4f}, {t[1]:.4f}]" if t else "not installed"
        time_ = _duration(w["ours_t"][m])
        if t:
            ratio = w["theirs_t"][m] / w["ours_t"][m]
            time_ += f" / {_duration(w['theirs_t'][m])}" + (f" (**{ratio:.0f}×**)" if m == "bayes" else "")
        lines.append(f"| {LABEL[m]} | [{p[0]:.3f}, {p[1]:.3f}] | [{o[0]:.4f}, {o[1]:.4f}] | {theirs} | {time_} |")
    if w["cdf"]:
        (ours_hi, f_ours), (theirs_hi, f_theirs) = w["cdf"]["ours"], w["cdf"]["privacy-estimates"]
        lines += [
            "",
            f"The authors' own CDF (dblquad, `epsabs=1e-7`) at the Bayesian upper ends (target 0.975): "
            f"F({ours_hi:.5f}) = {f_ours:.6f} at ours, F({theirs_hi:.5f}) = {f_theirs:.6f} at theirs.",
        ]
    paper = {"bayes": "just over 500", "jeffreys": "a little under CP", "clopper_pearson": "~1500"}
    lines += [
        "",
        "| (ii) Fig. 4: FPR = FNR = 0.4, 90%, δ = 1e−5; trials for ±0.15 | paper | ours (inside ε̂ ± 0.15) | "
        "ours (width ≤ 0.3) |",
        "|---|---|---|---|",
        *(f"| {LABEL[m]} | {paper[m]} | {RESULTS['figure_4'][m][0]} | {RESULTS['figure_4'][m][1]} |" for m in METHODS),
    ]
    f5 = RESULTS["figure_5"]
    trials = f5["trials"]
    lines += [
        "",
        f"| (iii) Fig. 5: {trials} trials ({trials // 2} + {trials // 2}), 90%, δ = 1e−5, FPR, FNR ∈ {{0.01 … 0.5}} "
        "| paper | ours |",
        "|---|---|---|",
        f"| width reduction vs Jeffreys | 20–32% | {_range(f5['vs_j'])} |",
        f"| width reduction vs Clopper-Pearson | 36–52% | {_range(f5['vs_cp'])} |",
        f"| Clopper-Pearson ε interval wider than the Jeffreys one by | — | {_range(f5['cp_wider'])} |",
    ]
    sel = RESULTS["selection"]
    label = {
        ("holdout", "attack"): '`selection="holdout"` (default)',
        ("bonferroni", "attack"): '`selection="bonferroni"`',
        ("none", "attack"): '`selection="none"` (optimistic)',
        ("holdout", "full"): '`selection="holdout"`, `region="full"`',
    }
    lines += [
        "",
        "| (iv) No-power attack (scores independent of membership), 100 + 100, δ = 1e−5, α = 0.05, "
        f"{sel['reps']} runs | share claiming ε̂₋ > 0 |",
        "|---|---|",
        *(f"| {label[case]} | {share:.2f} |" for case, share in sel["claims"].items()),
        "",
        f"Written by `{command}` in {seconds:.0f} s (numpy {np.__version__}, Python {platform.python_version()}); "
        "times are medians of 20 calls (ours) and one call (privacy-estimates).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="evaluate the authors' CDF at the endpoints (~40 s)")
    parser.add_argument("--reps", type=int, default=100, help="repetitions of the selection simulation")
    parser.add_argument(
        "--output", default=None, help="write the published Markdown tables to this file (benchmarks/results/...md)"
    )
    args = parser.parse_args()
    start = time.perf_counter()
    worked_example(args.verify)
    figure_4(delta=1e-5)
    figure_5(delta=1e-5, trials=1000)
    selection(args.reps)
    if args.output:
        command = shlex.join(["python", "benchmarks/estimation.py", *sys.argv[1:]])
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(published(time.perf_counter() - start, command), encoding="utf-8")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
