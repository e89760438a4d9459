"""Every logged metric key, as a constant.

The ``/`` groups keys into TensorBoard sections: ``dp/`` for the DP-SGD mechanism and its reference
accountant, ``privacy/`` for per-epoch bounds, ``audit/`` for post-training audits.
"""

# DP-SGD mechanism (per epoch)
DP_NOISE_MULTIPLIER = "dp/noise_multiplier"
DP_SAMPLE_RATE = "dp/sample_rate"
DP_STEPS = "dp/steps"
DP_EPSILON = "dp/epsilon"  # the run's epsilon at its delta, add/remove (default: certified upper bound, PLD)

# DP-SGD settings (HPARAMS columns, beside the model's own hyperparameters)
DP_MAX_GRAD_NORM = "dp/max_grad_norm"
DP_DELTA = "dp/delta"
DP_ACCOUNTANT = "dp/accountant"
DP_TARGET_BAYES_SECURITY = "dp/target_bayes_security"
DP_TARGET_EPSILON = "dp/target_epsilon"
DP_PLANNED_EPOCHS = "dp/planned_epochs"
DP_GRAD_SAMPLE_MODE = "dp/grad_sample_mode"  # "hooks" (per-sample gradients) or "ghost" (ghost clipping)
DP_SAMPLING_SEED = "dp/sampling_seed"  # the Poisson masks' seed: secret / fixed / secure (never the seed itself)
DP_NOISE_SEED = "dp/noise_seed"  # the noise's seed: secret / fixed / secure (never the seed itself)
DP_EXPECTED_BATCH_SIZE = "dp/expected_batch_size"  # the public constant the noised clipped sum is divided by
DP_SAMPLE_RATE_SOURCE = "dp/sample_rate_source"  # "1/len(train loader)" or "argument" (what q makes public)
DP_CLIPPING = "dp/clipping"  # "fixed" (clip to C) or "automatic" (each gradient × 1/(‖g‖ + γ))
DP_PRIVACY_UNIT = "dp/privacy_unit"  # "example" (a row) or "person" (DPSGD(privacy_unit="user")): whose ε it is
DP_MAX_EXAMPLES_PER_USER = "dp/max_examples_per_user"  # k, the most rows of one person a step can see (person only)
DP_USER_SAMPLING = "dp/user_sampling"  # "people" (ULS) or "rows" (ELS, accounted for groups of k) (person only)

# Clipping telemetry (per epoch, opt-in; data-dependent, not covered by the DP guarantee)
DP_CLIP_FRACTION = "dp/clip_fraction"  # share of per-sample gradients whose norm exceeded C
DP_GRAD_NORM_MEDIAN = "dp/grad_norm_median"
DP_GRAD_NORMS = "dp/grad_norms"  # histogram of per-sample gradient norms
DP_EXACTNESS_ERROR = "dp/exactness_error"  # largest mismatch between what was clipped and the examples' gradients
DP_AUTO_SWITCH_STEP = "dp/auto_switch_step"  # grad_sample_mode="auto": the step it left hooks for functional mode

# Bayes security (per epoch)
MIA_BAYES_SECURITY = "privacy/mia_bayes_security"  # safe: a certified lower bound (pessimistic PLD) every epoch
MIA_BAYES_SECURITY_CLOSED_FORM = "privacy/mia_bayes_security_closed_form"  # the paper's approximation
MIA_BAYES_SECURITY_EXACT = "privacy/mia_bayes_security_exact"  # the same safe value, in fit-end summaries
MIA_ADVANTAGE = "privacy/mia_advantage"
MIA_TPR_BOUND_FPR_0_001 = "privacy/mia_tpr_bound_fpr_0.001"  # tight: the composed mechanism's trade-off curve
MIA_TPR_BOUND_FPR_0_01 = "privacy/mia_tpr_bound_fpr_0.01"
MIA_TPR_BOUND_FPR_0_1 = "privacy/mia_tpr_bound_fpr_0.1"
APPROXIMATION_ERROR = "privacy/approximation_error"
BAYES_SECURITY_FIGURE = "privacy/bayes_security"  # figure: β* per epoch and the TPR-FPR region
AI_BAYES_SECURITY = "privacy/ai_bayes_security"  # safe: composed PLD over the measured R_t, every epoch
AI_BAYES_SECURITY_CLOSED_FORM = "privacy/ai_bayes_security_closed_form"  # the paper's Cor. 10 (approximation)
AI_SENSITIVITY = "privacy/ai_sensitivity"  # per step; only when publishing is allowed

# Post-training audits
EPSILON_STAR = "audit/epsilon_star"
EPSILON_STAR_EMPIRICAL = "audit/epsilon_star_empirical"
MIA_EPSILON_LOWER = "audit/mia_epsilon_lower"
PANORAMIA_EPSILON = "audit/panoramia_epsilon"
PANORAMIA_C_LB = "audit/panoramia_c_lb"
PANORAMIA_C_PLUS_EPSILON_LB = "audit/panoramia_c_plus_epsilon_lb"
PROFILE_MAX_LOSS = "audit/profile_max_loss"  # max_i |l(x, y_i, M)| (|l|/β when no ε is known)
PROFILE_EPSILON_LOW = "audit/profile_epsilon_low"  # recommended ε range, lower end
PROFILE_EPSILON_HIGH = "audit/profile_epsilon_high"  # recommended ε range, upper end
PROFILE_GRADIENT_NORM = "audit/profile_gradient_norm"  # ‖∇J(A(x))‖ (0 at the optimum)
PROFILE_APPROXIMATION_BOUND = "audit/profile_approximation_bound"  # bound on ‖A_wc − A(y)‖/‖A(y) − A(x)‖
PROFILE_LOSSES = "audit/profile_losses"  # histogram of |l|
PROFILE_TOP_ROWS = "audit/profile_top_rows"  # text table of the most exposed rows
PROFILE_FIGURE = "audit/profile_transition"  # figure: typical profile across ε
EPSILON_STAR_MEMBER_LOSSES = "audit/epsilon_star/member_losses"  # histogram of the member losses
EPSILON_STAR_NONMEMBER_LOSSES = "audit/epsilon_star/nonmember_losses"  # histogram of the non-member losses
EPSILON_STAR_FIGURE = "audit/epsilon_star/transformed_fits"  # figure: transformed losses and Normal fits
EPSILON_STAR_SUMMARY = "audit/epsilon_star/summary"  # text: the Epsilon* table
PANORAMIA_FIGURE = "audit/panoramia_epsilon/curves"  # figure: precision-recall and bounds over recall
PANORAMIA_SUMMARY = "audit/panoramia_epsilon/summary"  # text: the numbers, their meaning, the most real rows
PRIVACY_REPORT = "privacy/report"  # text: the end-of-training privacy report (lightning_privacy.report)
CANARY_EPSILON_LOWER = "audit/canary_epsilon_lower"  # one-run canary audit: valid ε lower bound (Steinke et al.)
CANARY_EPSILON_LOWER_FDP = "audit/canary_epsilon_lower_fdp"  # f-DP test of the (ε, δ) curve: valid for any mechanism
CANARY_GUESSES = "audit/canary_guesses"  # r of the reported binomial test
CANARY_CORRECT = "audit/canary_correct"  # v of the reported binomial test
CANARY_GUESSES_FDP = "audit/canary_guesses_fdp"
CANARY_CORRECT_FDP = "audit/canary_correct_fdp"
CANARY_EPSILON_LOWER_MAX = "audit/canary_epsilon_lower_max"  # the largest bound m canaries can give (binomial)
CANARY_EPSILON_LOWER_MAX_FDP = "audit/canary_epsilon_lower_max_fdp"
CANARY_EPSILON_OPTIMISTIC = "audit/canary_epsilon_optimistic"  # uncorrected best over the grid: NOT a valid bound
CANARY_EPSILON_OPTIMISTIC_FDP = "audit/canary_epsilon_optimistic_fdp"
CANARY_EPSILON_LOWER_ORDERSTAT = "audit/canary_epsilon_lower_orderstat"  # order statistics, (ε, δ) curve: independent
CANARY_EPSILON_LOWER_TIGHTEST = "audit/canary_epsilon_lower_tightest"  # tightest sound bound, α split over its tests
# Gaussian readings: μ read as ε through the Gaussian trade-off curve, lower bounds only if the mechanism is μ-GDP
CANARY_EPSILON_GDP_GAUSSIAN_READING = "audit/canary_epsilon_gdp_gaussian_reading"  # Mahloujifar et al.'s Gaussian test
CANARY_GUESSES_GDP = "audit/canary_guesses_gdp"
CANARY_CORRECT_GDP = "audit/canary_correct_gdp"
CANARY_EPSILON_GDP_GAUSSIAN_READING_MAX = "audit/canary_epsilon_gdp_gaussian_reading_max"
CANARY_EPSILON_OPTIMISTIC_GDP = "audit/canary_epsilon_optimistic_gdp"
CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING = "audit/canary_epsilon_orderstat_gaussian_reading"  # independent canaries
CANARY_EPSILON_GAUSS = "audit/canary_epsilon_gauss"  # Gaussian score model (noncentral t): an estimate, not a bound
CANARY_CLAIM_CONTRADICTED = (
    "audit/canary_claim_contradicted"  # 1: the canaries contradict the claimed guarantee at 1 − α, 0: consistent
)
CANARY_FIGURE = "audit/canary_epsilon_lower/theory_vs_practice"  # figure: accountant ε vs the empirical bounds
CANARY_SUMMARY = "audit/canary_epsilon_lower/summary"  # text: the canary audit table

# Reference-model membership attacks (audits.audit_membership, MembershipAudit): audit/<attack>_<quantity>
RMIA_AUC = "audit/rmia_auc"
RMIA_TPR_AT_FPR_0_001 = "audit/rmia_tpr_at_fpr_0.001"
RMIA_TPR_AT_FPR_0_01 = "audit/rmia_tpr_at_fpr_0.01"
RMIA_TPR_AT_FPR_0_1 = "audit/rmia_tpr_at_fpr_0.1"
RMIA_EPSILON_LOWER = "audit/rmia_epsilon_lower"  # valid ε lower bound from the scores (holdout threshold)
RMIA_CLAIM_CONTRADICTED = "audit/rmia_claim_contradicted"  # 1: the attack contradicts the claimed guarantee at 1 − α (add/remove), 0: consistent
LIRA_AUC = "audit/lira_auc"
LIRA_TPR_AT_FPR_0_001 = "audit/lira_tpr_at_fpr_0.001"
LIRA_TPR_AT_FPR_0_01 = "audit/lira_tpr_at_fpr_0.01"
LIRA_TPR_AT_FPR_0_1 = "audit/lira_tpr_at_fpr_0.1"
LIRA_EPSILON_LOWER = "audit/lira_epsilon_lower"
LIRA_CLAIM_CONTRADICTED = "audit/lira_claim_contradicted"  # 1: the attack contradicts the claimed guarantee at 1 − α (add/remove), 0: consistent
LOSS_AUC = "audit/loss_auc"
LOSS_TPR_AT_FPR_0_001 = "audit/loss_tpr_at_fpr_0.001"
LOSS_TPR_AT_FPR_0_01 = "audit/loss_tpr_at_fpr_0.01"
LOSS_TPR_AT_FPR_0_1 = "audit/loss_tpr_at_fpr_0.1"
LOSS_EPSILON_LOWER = "audit/loss_epsilon_lower"
LOSS_CLAIM_CONTRADICTED = "audit/loss_claim_contradicted"  # 1: the attack contradicts the claimed guarantee at 1 − α (add/remove), 0: consistent
EZMIA_AUC = "audit/ezmia_auc"  # EZ-MIA: a fine-tuned LM against its base model (Error Zone score)
EZMIA_TPR_AT_FPR_0_001 = "audit/ezmia_tpr_at_fpr_0.001"
EZMIA_TPR_AT_FPR_0_01 = "audit/ezmia_tpr_at_fpr_0.01"
EZMIA_TPR_AT_FPR_0_1 = "audit/ezmia_tpr_at_fpr_0.1"
EZMIA_EPSILON_LOWER = "audit/ezmia_epsilon_lower"
EZMIA_CLAIM_CONTRADICTED = "audit/ezmia_claim_contradicted"  # 1: the attack contradicts the claimed guarantee at 1 − α (add/remove), 0: consistent
MEMBERSHIP_FIGURE = "audit/membership/roc"  # figure: log-log ROC inside the accountant's region
MEMBERSHIP_SUMMARY = "audit/membership/summary"  # text: the attack's table


def membership_key(attack: str, quantity: str) -> str:
    """``audit/<attack>_<quantity>`` (``attack`` in rmia/lira/loss/ezmia), one of the constants above.

    Example::

        >>> membership_key("rmia", "tpr_at_fpr_0.01")
        'audit/rmia_tpr_at_fpr_0.01'
    """
    key = f"audit/{attack}_{quantity}"
    if key not in ALL_KEYS:
        raise ValueError(f"Expected a membership-attack key, but {key!r} is not one of lightning_privacy.names")
    return key


ALL_KEYS = tuple(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))

# --- what each key means, its unit, and how far to trust it (the logged-keys page renders this; a test checks that
# every key has all three)
SETTING = "setting (as configured)"
EPSILON_BOUND = (
    "upper bound on ε, add/remove: certified by default (the pessimistic PLD β* comes from); Opacus' RDP/PRV by name, "
    "GDP an approximation"
)
CERTIFIED = "certified bound, on the safe side (pessimistic PLD of the recorded history)"
APPROXIMATION = "approximation (may overstate security; shown beside the certified value)"
LOWER_BOUND = "valid lower bound at confidence 1 − α (statistical evidence)"
ESTIMATE = "estimate: no guarantee either way"
GAUSSIAN_READING = (
    "Gaussian reading: a lower bound at confidence 1 − α only if the mechanism is μ-GDP (its trade-off curve Gaussian); "
    "it can exceed the true ε of other (ε, δ)-DP mechanisms"
)
VERDICT = "verdict at confidence 1 − α, multiple comparisons corrected"
DIAGNOSTIC = "diagnostic: how a bound was obtained"
NOT_PRIVATE = "data-dependent, NOT covered by the DP guarantee"
MEDIA = "figure / text / histogram (for reading, not a number)"

KEY_DOCS = {
    DP_NOISE_MULTIPLIER: ("σ, the noise standard deviation relative to the clipping norm C", "ratio", SETTING),
    DP_SAMPLE_RATE: ("p, each row's Poisson inclusion probability per step", "probability", SETTING),
    DP_STEPS: ("optimizer steps the accountant recorded (over resumes)", "steps", CERTIFIED),
    DP_EPSILON: (
        "the run's ε at its δ, one example added or removed (dp/accountant says which)",
        "ε (nats)",
        EPSILON_BOUND,
    ),
    DP_MAX_GRAD_NORM: ("C, each example's gradient clipped to this norm", "gradient norm", SETTING),
    DP_DELTA: ("δ of the run's ε", "probability", SETTING),
    DP_ACCOUNTANT: (
        "the accountant of ε: pld (the package's pessimistic PLD, default), or Opacus' rdp, prv, gdp",
        "name",
        SETTING,
    ),
    DP_TARGET_BAYES_SECURITY: ("the β*_MIA σ was planned for", "β* in [0, 1]", SETTING),
    DP_TARGET_EPSILON: ("the ε σ was planned for", "ε (nats)", SETTING),
    DP_PLANNED_EPOCHS: ("the epochs σ was planned for", "epochs", SETTING),
    DP_GRAD_SAMPLE_MODE: (
        "hooks (per-sample gradients), ghost (ghost clipping) or functional (torch.func); auto's pick at fit start",
        "name",
        SETTING,
    ),
    DP_SAMPLING_SEED: ("how the Poisson masks' seed was chosen: secret, fixed or secure", "kind", SETTING),
    DP_NOISE_SEED: ("how the noise's seed was chosen: secret, fixed or secure", "kind", SETTING),
    DP_EXPECTED_BATCH_SIZE: (
        "the public constant each step's noised clipped sum is divided by (loader batch size or argument)",
        "rows",
        SETTING,
    ),
    DP_SAMPLE_RATE_SOURCE: ("where p came from: the argument, or 1/len(train loader)", "name", SETTING),
    DP_CLIPPING: ("the clipping rule: fixed (clip to C) or automatic (1/(‖g‖ + γ), sensitivity 1)", "name", SETTING),
    DP_PRIVACY_UNIT: ("whose privacy every ε, β* and bound is: one example (row) or one person", "name", SETTING),
    DP_MAX_EXAMPLES_PER_USER: ("k: a person's rows beyond it are left out (person-level runs)", "rows", SETTING),
    DP_USER_SAMPLING: ("what a step samples: people (each clipped whole) or rows (person-level runs)", "name", SETTING),
    DP_CLIP_FRACTION: ("share of per-sample gradients whose norm exceeded C", "fraction", NOT_PRIVATE),
    DP_GRAD_NORM_MEDIAN: ("median per-sample gradient norm before clipping", "gradient norm", NOT_PRIVATE),
    DP_GRAD_NORMS: ("histogram of per-sample gradient norms", "gradient norm", NOT_PRIVATE),
    DP_EXACTNESS_ERROR: (
        "largest mismatch between what DP-SGD clipped and the examples' whole gradients on the self-checked steps",
        "fraction of the gradient norm",
        DIAGNOSTIC,
    ),
    DP_AUTO_SWITCH_STEP: (
        "grad_sample_mode='auto': the step at which Opacus' hooks disagreed and functional mode took over (logged "
        "once switched)",
        "optimizer step",
        DIAGNOSTIC,
    ),
    MIA_BAYES_SECURITY: (
        "β*_MIA: 1 − the best membership attack's advantage (replace game)",
        "β* in [0, 1]",
        CERTIFIED,
    ),
    MIA_BAYES_SECURITY_CLOSED_FORM: (
        "β*_MIA by the paper's closed form (Cherubin et al. 2024, Eq. 4)",
        "β*",
        APPROXIMATION,
    ),
    MIA_BAYES_SECURITY_EXACT: ("the certified β*_MIA, in fit-end summaries", "β* in [0, 1]", CERTIFIED),
    MIA_ADVANTAGE: ("1 − β*_MIA: the largest TPR − FPR of any membership attack", "advantage in [0, 1]", CERTIFIED),
    MIA_TPR_BOUND_FPR_0_001: ("the largest TPR any attack reaches at FPR 0.001", "TPR", CERTIFIED),
    MIA_TPR_BOUND_FPR_0_01: ("the largest TPR any attack reaches at FPR 0.01", "TPR", CERTIFIED),
    MIA_TPR_BOUND_FPR_0_1: ("the largest TPR any attack reaches at FPR 0.1", "TPR", CERTIFIED),
    APPROXIMATION_ERROR: ("closed form − certified β*_MIA (> 0: the closed form overstates)", "β*", DIAGNOSTIC),
    BAYES_SECURITY_FIGURE: ("β* per epoch and the TPR–FPR region", "figure", MEDIA),
    AI_BAYES_SECURITY: ("β*_AI against attribute inference, over the measured sensitivities R_t", "β*", CERTIFIED),
    AI_BAYES_SECURITY_CLOSED_FORM: ("β*_AI by the paper's Corollary 10", "β*", APPROXIMATION),
    AI_SENSITIVITY: (
        "R_t, the step's attribute sensitivity (only when publishing is allowed)",
        "gradient norm",
        NOT_PRIVATE,
    ),
    EPSILON_STAR: ("Epsilon* from Normal fits of the transformed losses (Negoescu et al. 2023)", "ε", ESTIMATE),
    EPSILON_STAR_EMPIRICAL: ("Epsilon* from the empirical loss distributions", "ε", ESTIMATE),
    MIA_EPSILON_LOWER: (
        "ε lower bound of the loss-threshold attack (Bayesian interval, holdout threshold)",
        "ε",
        LOWER_BOUND,
    ),
    PANORAMIA_EPSILON: ("ε̃ = (c + ε)_lb − c_lb of PANORAMIA (Kazmi et al. 2024)", "ε", ESTIMATE),
    PANORAMIA_C_LB: ("c_lb, how well a baseline tells real from generated data", "ε-like", LOWER_BOUND),
    PANORAMIA_C_PLUS_EPSILON_LB: ("(c + ε)_lb, the membership attack's lower bound", "ε-like", LOWER_BOUND),
    PROFILE_MAX_LOSS: ("max_i |l(x, y_i, M)|, the most exposed row's privacy loss", "ε units", ESTIMATE),
    PROFILE_EPSILON_LOW: ("recommended ε range, lower end (LeBlond et al. 2023)", "ε", ESTIMATE),
    PROFILE_EPSILON_HIGH: ("recommended ε range, upper end", "ε", ESTIMATE),
    PROFILE_GRADIENT_NORM: ("‖∇J(A(x))‖ at the trained model (0 at the optimum)", "gradient norm", DIAGNOSTIC),
    PROFILE_APPROXIMATION_BOUND: ("bound on ‖A_wc − A(y)‖ / ‖A(y) − A(x)‖", "ratio", DIAGNOSTIC),
    PROFILE_LOSSES: ("histogram of |l| over rows", "ε units", MEDIA),
    PROFILE_TOP_ROWS: ("the most exposed rows", "text", MEDIA),
    PROFILE_FIGURE: ("the typical privacy profile across ε", "figure", MEDIA),
    EPSILON_STAR_MEMBER_LOSSES: ("histogram of the member losses", "loss", MEDIA),
    EPSILON_STAR_NONMEMBER_LOSSES: ("histogram of the non-member losses", "loss", MEDIA),
    EPSILON_STAR_FIGURE: ("transformed losses and their Normal fits", "figure", MEDIA),
    EPSILON_STAR_SUMMARY: ("the Epsilon* table", "text", MEDIA),
    PANORAMIA_FIGURE: ("precision–recall and the bounds over recall", "figure", MEDIA),
    PANORAMIA_SUMMARY: ("PANORAMIA's numbers, their meaning, the most real rows", "text", MEDIA),
    PRIVACY_REPORT: ("the end-of-training privacy report", "text", MEDIA),
    CANARY_EPSILON_LOWER: ("one-run canary audit's ε lower bound (Steinke et al. 2023, binomial)", "ε", LOWER_BOUND),
    CANARY_EPSILON_LOWER_FDP: (
        "the f-DP test (Mahloujifar et al.) of the (ε, δ) trade-off curve: valid for every (ε, δ)-DP mechanism",
        "ε",
        LOWER_BOUND,
    ),
    CANARY_GUESSES: ("r, guesses of the reported binomial test", "count", DIAGNOSTIC),
    CANARY_CORRECT: ("v, correct guesses of the reported binomial test", "count", DIAGNOSTIC),
    CANARY_GUESSES_FDP: ("r of the reported f-DP test of the (ε, δ) curve", "count", DIAGNOSTIC),
    CANARY_CORRECT_FDP: ("v of the reported f-DP test of the (ε, δ) curve", "count", DIAGNOSTIC),
    CANARY_EPSILON_LOWER_MAX: ("the largest binomial bound m canaries can give", "ε", DIAGNOSTIC),
    CANARY_EPSILON_LOWER_MAX_FDP: ("the largest f-DP (ε, δ) bound m canaries can give", "ε", DIAGNOSTIC),
    CANARY_EPSILON_OPTIMISTIC: ("uncorrected best over the guess grid: NOT a valid bound", "ε", ESTIMATE),
    CANARY_EPSILON_OPTIMISTIC_FDP: (
        "uncorrected best f-DP (ε, δ) value over the grid: NOT a valid bound",
        "ε",
        ESTIMATE,
    ),
    CANARY_EPSILON_LOWER_ORDERSTAT: (
        "ε lower bound from the order statistics of the canary scores, read through the (ε, δ) curve (any (ε, δ)-DP "
        "mechanism; independent canaries only)",
        "ε",
        LOWER_BOUND,
    ),
    CANARY_EPSILON_GDP_GAUSSIAN_READING: (
        "the Gaussian f-DP test (Mahloujifar et al.): μ read as ε through the Gaussian curve, if the mechanism is μ-GDP",
        "ε",
        GAUSSIAN_READING,
    ),
    CANARY_GUESSES_GDP: ("r of the reported Gaussian f-DP test", "count", DIAGNOSTIC),
    CANARY_CORRECT_GDP: ("v of the reported Gaussian f-DP test", "count", DIAGNOSTIC),
    CANARY_EPSILON_GDP_GAUSSIAN_READING_MAX: ("the largest Gaussian reading m canaries can give", "ε", DIAGNOSTIC),
    CANARY_EPSILON_OPTIMISTIC_GDP: (
        "uncorrected best Gaussian reading over the grid: NOT a valid bound",
        "ε",
        ESTIMATE,
    ),
    CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING: (
        "the order statistics' μ read as ε through the Gaussian curve (if μ-GDP; independent canaries only)",
        "ε",
        GAUSSIAN_READING,
    ),
    CANARY_EPSILON_GAUSS: (
        "ε from a Gaussian model of the canary scores (noncentral t): not a DP bound",
        "ε",
        ESTIMATE,
    ),
    CANARY_EPSILON_LOWER_TIGHTEST: (
        "the largest of the canary bounds valid for every (ε, δ)-DP mechanism, each at its fixed share of α (f-DP "
        "test of the (ε, δ) curve; order statistics for independent canaries); the summary names the test",
        "ε",
        LOWER_BOUND,
    ),
    CANARY_CLAIM_CONTRADICTED: ("1 when the canaries contradict the claimed guarantee, else 0", "0/1", VERDICT),
    CANARY_FIGURE: ("the accountant's ε beside the empirical bounds", "figure", MEDIA),
    CANARY_SUMMARY: ("the canary audit table", "text", MEDIA),
    MEMBERSHIP_FIGURE: ("log–log ROC inside the claim's add/remove region", "figure", MEDIA),
    MEMBERSHIP_SUMMARY: ("the attack's table", "text", MEDIA),
}
for _attack, (_who, _paper) in {
    "rmia": ("RMIA", " (Zarifzadeh et al. 2024)"),
    "lira": ("LiRA", " (Carlini et al. 2022)"),
    "loss": ("the LOSS attack", ""),
    "ezmia": ("EZ-MIA", " (Ilić et al. 2026: the fine-tuned LM against its base)"),
}.items():
    KEY_DOCS[membership_key(_attack, "auc")] = (f"area under {_who}'s ROC{_paper}", "AUC in [0, 1]", ESTIMATE)
    for _fpr in ("0.001", "0.01", "0.1"):
        KEY_DOCS[membership_key(_attack, f"tpr_at_fpr_{_fpr}")] = (f"{_who}'s TPR at FPR ≤ {_fpr}", "TPR", ESTIMATE)
    KEY_DOCS[membership_key(_attack, "epsilon_lower")] = (
        f"ε lower bound from {_who}'s scores (holdout threshold)",
        "ε",
        LOWER_BOUND,
    )
    KEY_DOCS[membership_key(_attack, "claim_contradicted")] = (
        f"1 when {_who} contradicts the claimed guarantee (add/remove), else 0",
        "0/1",
        VERDICT,
    )

del _attack, _who, _paper, _fpr
