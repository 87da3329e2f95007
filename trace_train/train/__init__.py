"""The train stage's room: GRPO of one LoRA adapter per capability, its config and its baselines.

* :mod:`~trace_train.train.config`: :class:`~trace_train.train.config.TrainConfig`, every setting of
  ``trace train`` with its help text;
* :mod:`~trace_train.train.grpo`: :func:`~trace_train.train.grpo.train` on TRL's ``GRPOTrainer`` with TRACE's
  own rollouts;
* :mod:`~trace_train.train.sft`: the "SFT on synthetic data" baseline (``TrainConfig.sft``);
* :mod:`~trace_train.train.calibration`: the base model's groups before training;
* :mod:`~trace_train.train.prefix_logprobs`: the loss's log-probs with the shared prefix encoded once.

Nothing is imported here (torch and TRL load only when a run starts).
"""
