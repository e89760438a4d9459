"""Train any LightningModule under DP-SGD with the privacy callbacks, all set in one LightningCLI config.

The script is Lightning's own ``LightningCLI``: the model, the datamodule, the trainer and every
callback come from the YAML (``class_path`` + ``init_args``), so the same script trains your model
once you name your classes in a copy of the config. ``adult_dpsgd.yaml`` beside it trains the Adult
MLP (``lightning_privacy.models.TabularMLP`` on ``lightning_privacy.data.AdultDataModule``) with

- ``DPSGD``: Opacus DP-SGD (σ, C);
- ``BayesSecurityMonitor``: β*_MIA (``privacy/mia_bayes_security``) and ε every epoch;
- ``AttributeInferenceMonitor`` with ``attribute: age``: the name is looked up with the datamodule's
  ``sensitive_attribute("age")`` (raw ages 17..90, written standardised like input column 0);
  β*_AI (``privacy/ai_bayes_security``) every epoch;
- ``PrivacyBudgetStopping``: stops before the step that would take β*_MIA below the budget;
- ``EpsilonStarAudit``: Epsilon* of the trained model at fit end.

Run (the config is tiny: 2 epochs of 20 batches; override anything on the command line)::

    pip install "lightning-privacy[cli]"          # jsonargparse[signatures], which LightningCLI needs
    python examples/cli/train.py fit --config examples/cli/adult_dpsgd.yaml
    python examples/cli/train.py fit --config examples/cli/adult_dpsgd.yaml --trainer.max_epochs=5 \\
        --trainer.limit_train_batches=null       # full epochs
    tensorboard --logdir lightning_logs
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI


def main(args: list[str] | None = None) -> LightningCLI:
    """Run the CLI (``args`` as on the command line; ``None`` reads ``sys.argv``)."""
    return LightningCLI(args=args, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
