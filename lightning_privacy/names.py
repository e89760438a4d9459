"""Every logged metric key, as a constant.

The ``/`` groups keys into TensorBoard sections: ``dp/`` for the DP-SGD mechanism and its reference
accountant, ``privacy/`` for per-epoch bounds, ``audit/`` for post-training audits.
"""

# DP-SGD mechanism (per epoch)
DP_NOISE_MULTIPLIER = "dp/noise_multiplier"
DP_SAMPLE_RATE = "dp/sample_rate"
DP_STEPS = "dp/steps"
DP_EPSILON = "dp/epsilon"  # Opacus accountant epsilon at the run's delta (reference only)

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

# Clipping telemetry (per epoch, opt-in; data-dependent, not covered by the DP guarantee)
DP_CLIP_FRACTION = "dp/clip_fraction"  # share of per-sample gradients whose norm exceeded C
DP_GRAD_NORM_MEDIAN = "dp/grad_norm_median"
DP_GRAD_NORMS = "dp/grad_norms"  # histogram of per-sample gradient norms

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
CANARY_EPSILON_LOWER_GDP = "audit/canary_epsilon_lower_gdp"  # the same from the Gaussian f-DP test (Mahloujifar et al.)
CANARY_GUESSES = "audit/canary_guesses"  # r of the reported binomial test
CANARY_CORRECT = "audit/canary_correct"  # v of the reported binomial test
CANARY_GUESSES_GDP = "audit/canary_guesses_gdp"
CANARY_CORRECT_GDP = "audit/canary_correct_gdp"
CANARY_EPSILON_LOWER_MAX = "audit/canary_epsilon_lower_max"  # the largest bound m canaries can give (binomial)
CANARY_EPSILON_LOWER_MAX_GDP = "audit/canary_epsilon_lower_max_gdp"
CANARY_EPSILON_OPTIMISTIC = "audit/canary_epsilon_optimistic"  # uncorrected best over the grid: NOT a valid bound
CANARY_EPSILON_OPTIMISTIC_GDP = "audit/canary_epsilon_optimistic_gdp"
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
MEMBERSHIP_FIGURE = "audit/membership/roc"  # figure: log-log ROC inside the accountant's region
MEMBERSHIP_SUMMARY = "audit/membership/summary"  # text: the attack's table


def membership_key(attack: str, quantity: str) -> str:
    """``audit/<attack>_<quantity>`` (``attack`` in rmia/lira/loss), one of the constants above.

    Example::

        >>> membership_key("rmia", "tpr_at_fpr_0.01")
        'audit/rmia_tpr_at_fpr_0.01'
    """
    key = f"audit/{attack}_{quantity}"
    if key not in ALL_KEYS:
        raise ValueError(f"Expected a membership-attack key, but {key!r} is not one of lightning_privacy.names")
    return key


ALL_KEYS = tuple(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
