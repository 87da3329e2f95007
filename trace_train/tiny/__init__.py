"""The tiny offline model's room: everything that makes, warms up and runs the CPU model TRACE ships with.

* :mod:`~trace_train.tiny.build`: size presets, the content key, :func:`~trace_train.tiny.build.build_model`;
* :mod:`~trace_train.tiny.copy_circuit`: the hand-set induction circuit the ``tiny`` preset is built with;
* :mod:`~trace_train.tiny.tokenizer`: the byte-level BPE trained on the envs' text, with TRL's Qwen3 template;
* :mod:`~trace_train.tiny.bootstrap`: the SFT warm-up (:class:`~trace_train.tiny.bootstrap.BootstrapConfig`);
* :mod:`~trace_train.tiny.sft_data`: oracle episodes as SFT rows; :mod:`~trace_train.tiny.sft_forward`: the
  fast, exact SFT forward;
* :mod:`~trace_train.tiny.fast_decode`: the hand-written decode loop (``decode: fast``);
* :mod:`~trace_train.tiny.metadata`: ``trace_model.json`` and the env kwargs a model was trained with;
* :mod:`~trace_train.tiny.shipped`: the warmed-up base shipped with the project.

Nothing is imported here, so ``import trace_train.tiny.metadata`` stays light.
"""
