"""The DP-SGD engine: everything DP-SGD does in a fit, apart from the Lightning callback that wires it in.

:class:`~lightning_privacy.DPSGD` (``lightning_privacy/callbacks/dpsgd.py``) is the adapter: it calls these modules
from the Trainer's hooks and logs what they measure. Each concern has one home:

- :mod:`~lightning_privacy.dpsgd.sampling` — Poisson sampling: the secret masks, the batch sampler and loader, empty
  batches; :mod:`~lightning_privacy.dpsgd.loaders` swaps it into a Trainer's train loader.
- :mod:`~lightning_privacy.dpsgd.noise` — the noise's randomness (:class:`NoiseSource`);
  :mod:`~lightning_privacy.dpsgd.optimizers` — Opacus' DP optimizers with DPSGD's mixins (secret noise, noise added
  into the gradient, before-noise hooks, clipping in the parameters' precision).
- Clipping: :mod:`~lightning_privacy.dpsgd.backward` (DPSGD's stand-in for ``training_step`` and ``backward``:
  empty batches, the checks every mode shares, :mod:`~lightning_privacy.dpsgd.step_guards`) dispatching to one class
  per mode behind :class:`~lightning_privacy.dpsgd.modes.Mode`: :mod:`~lightning_privacy.dpsgd.hooks_mode`,
  :mod:`~lightning_privacy.dpsgd.ghost_mode`, :mod:`~lightning_privacy.dpsgd.functional_mode` (on
  :mod:`~lightning_privacy.dpsgd.functional`'s engine) and :mod:`~lightning_privacy.dpsgd.auto` (the default: hooks,
  verified, switched to functional on a disagreement); :mod:`~lightning_privacy.dpsgd.bookkeeping` (the clipped sum in
  one pass),
  :mod:`~lightning_privacy.dpsgd.samplers` (Opacus' per-example samplers corrected for ``padding_idx``),
  :mod:`~lightning_privacy.dpsgd.exactness` (what is clipped is each example's whole gradient).
- :mod:`~lightning_privacy.dpsgd.strategies` — one process, DDP and FSDP2: hooks, optimizer classes, seeds.
- :mod:`~lightning_privacy.dpsgd.modules` — ``fix_modules``: layers Opacus cannot train replaced in place.
- Checks: :mod:`~lightning_privacy.dpsgd.checks` (per-sample gradients, clipping, batch statistics, tied parameters),
  :mod:`~lightning_privacy.dpsgd.noise_check` (the noise's standard deviation),
  :mod:`~lightning_privacy.dpsgd.self_checks` (when and where they run).
- The run: :mod:`~lightning_privacy.dpsgd.settings` (arguments, seeds, planned σ),
  :mod:`~lightning_privacy.dpsgd.install` (a fit's DP optimizer, hooks and backward, installed and removed),
  :mod:`~lightning_privacy.dpsgd.state` (checkpoint state), :mod:`~lightning_privacy.dpsgd.run` (reading a run's
  DP optimizers, DPSGD and accountant from a Trainer).

Layers: callbacks → dpsgd → functional, metrics → analysis; nothing here imports the callbacks. Only the modules
that meet the Trainer import Lightning beyond its ``MisconfigurationException`` (``tests/test_layers.py`` lists them).
``lightning_privacy.sampling``, ``lightning_privacy.noise`` and ``lightning_privacy.bookkeeping`` re-export the old
paths.
"""
