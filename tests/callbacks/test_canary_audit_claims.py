"""CanaryAudit checks a claimed guarantee: a run with far less noise than claimed is caught, the run's own ledger
(the default claim) is consistent, and the verdict is logged, summarised and drawn."""

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import DPSGD, CanaryAudit, names
from lightning_privacy.claims import Claim
from tests.callbacks.test_canary_audit import _fit

pytestmark = pytest.mark.filterwarnings("ignore")


def test_noise_far_below_the_claim_is_contradicted():
    dpsgd = DPSGD(noise_multiplier=0.3, sampling_seed=0)  # the run's truth: σ = 0.3, p ≈ 0.1, 30 steps
    claimed = CanaryAudit("gradient", num_canaries=1000, claim=(3.0, 0.1, 30))  # the claim: ten times the noise
    default = CanaryAudit("gradient", num_canaries=1000, seed=1)  # the run's own ledger
    _fit([dpsgd, claimed, default], epochs=3)
    result = claimed.result
    assert result.verdict == "contradicted" and claimed.results[names.CANARY_CLAIM_CONTRADICTED] == 1.0
    assert result.evidence["kind"] in ("binomial", "fdp") and result.evidence["statistic"] > result.evidence["bound"]
    assert "Verdict: contradicted at confidence 95%" in claimed.summary()
    out = result.to_dict()
    assert (
        out["claim"]["noise_multiplier"] == 3.0 and out["relation"] == "add_remove" and out["verdict"] == "contradicted"
    )
    bars = [t.get_text() for t in result.figure().axes[0].get_yticklabels()]
    assert any(label.startswith("claim ε at δ = 1e-05: CONTRADICTED") for label in bars)
    # the run's own claim holds (σ = 0.3 is what it accounted for)
    assert default.result.verdict == "consistent" and default.results[names.CANARY_CLAIM_CONTRADICTED] == 0.0
    assert default.result.claim.parameters["history"] == [list(seg) for seg in dpsgd.ledger.history]
    assert default.result.claim.epsilon == pytest.approx(Claim.from_ledger(dpsgd.ledger).epsilon)


def test_no_dp_sgd_no_claim_no_verdict_and_bad_claims_are_named():
    audit = CanaryAudit("input", num_canaries=50)
    _fit([audit], epochs=1)
    assert audit.result.verdict is None and names.CANARY_CLAIM_CONTRADICTED not in audit.results
    with pytest.raises(MisconfigurationException, match="`claim` must be a Claim"):
        CanaryAudit(claim="sigma=1")
    with pytest.raises(MisconfigurationException, match="`sample_rate` must be in \\(0, 1\\], got 1.5"):
        CanaryAudit(claim=(1.0, 1.5, 10))


def test_all_of_alpha_on_the_fdp_test():
    dpsgd = DPSGD(noise_multiplier=0.3, sampling_seed=0, noise_seed=0)
    fdp = CanaryAudit("gradient", num_canaries=1000, claim=(3.0, 0.1, 30), claim_tests="fdp")
    _fit([dpsgd, fdp], epochs=3)
    assert [t["kind"] for t in fdp.result.claim_verdict.tests] == ["fdp"]  # one test, at level α
    assert fdp.result.verdict == "contradicted" and fdp.result.evidence["kind"] == "fdp"
    # the same scores with α split: two tests, each at α / 2
    split = fdp.result.claim.check_canaries(fdp.canaries.scores, fdp.canaries.included, seed=fdp.seed)
    assert sorted(t["kind"] for t in split.tests) == ["binomial", "fdp"]
    assert {t["level"] for t in split.tests} == {0.025} and fdp.result.claim_verdict.tests[0]["level"] == 0.05
    with pytest.raises(MisconfigurationException, match="`claim_tests` must be one of \\('both', 'fdp'\\), got 'gdp'"):
        CanaryAudit(claim_tests="gdp")
    # an (ε, δ) claim has a curve too (Kairouz et al.'s): its f-DP test alone
    verdict = Claim.parse((1.0, 1e-5)).check_canaries([0.0, 1.0, 2.0, 3.0], [False, True, False, True], tests="fdp")
    assert [t["kind"] for t in verdict.tests] == ["fdp"]
    with pytest.raises(ValueError, match="`tests` must be 'both' or 'fdp', got 'all'"):
        Claim.parse((1.0, 1e-5)).check_canaries([0.0, 1.0], [False, True], tests="all")
