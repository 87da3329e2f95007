"""GRPO over a merged warm-up, its adapters folded back onto the base (``TrainConfig.sft_warmup_lora: fresh``).

With ``sft_warmup_lora: fresh`` GRPO trains a new LoRA over the model whose weights already hold the SFT warm-up
(``W + ΔW_warm``): its adapters are deltas over that merged model, which no other part of TRACE has. Everything
downstream (checkpoint selection, composition, merges, evaluation) loads an adapter over the *base*, so each
adapter GRPO saves is folded with the warm-up's into one LoRA on the base: ``W + ΔW_warm + ΔW_grpo`` with
``ΔW = B·A`` concatenated along the rank (PEFT's ``add_weighted_adapter(combination_type="cat")``): exact, of rank
``r_warm + r_grpo``.

Layout: a checkpoint ``checkpoints/checkpoint-N/`` keeps the delta (what a resumed run loads) and gets the folded
adapter in ``checkpoint-N/on_base/``; the run's final ``adapter/`` is the folded one, its delta in
``adapter_over_warmup/``. :func:`usable_adapter` is how readers pick the folder to load.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

#: The sub-folder of a checkpoint that holds its adapter folded onto the base.
ON_BASE = "on_base"
#: Beside ``adapter/``: the final delta over the merged warm-up.
OVER_WARMUP = "adapter_over_warmup"


def usable_adapter(folder: str | Path) -> Path:
    """The adapter folder to load over the base for a saved adapter or checkpoint: its ``on_base/`` when GRPO ran
    over a merged warm-up (the folder itself then holds a delta over that merged model), else the folder."""
    folder = Path(folder)
    folded = folder / ON_BASE
    return folded if (folded / "adapter_config.json").is_file() else folder


def merged_warmup(model, warmup_adapter: str | Path):
    """``model`` (a plain ``transformers`` model) with the warm-up LoRA at ``warmup_adapter`` merged into its
    weights: the model a fresh GRPO LoRA trains over."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(warmup_adapter)).merge_and_unload()


def fold_onto_base(base_model: str | Path, warmup_adapter: str | Path, delta_adapter: str | Path,
                   out: str | Path) -> Path:
    """Write to ``out`` one LoRA over ``base_model`` equal to the warm-up's LoRA followed by ``delta_adapter`` (a
    LoRA trained over the merged warm-up); returns ``out``. The two must target the same modules."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    warm_cfg = json.loads((Path(warmup_adapter) / "adapter_config.json").read_text())
    delta_cfg = json.loads((Path(delta_adapter) / "adapter_config.json").read_text())
    if sorted(warm_cfg.get("target_modules") or []) != sorted(delta_cfg.get("target_modules") or []):
        raise ValueError(f"cannot fold {delta_adapter} onto the warm-up {warmup_adapter}: they target other modules "
                         f"({delta_cfg.get('target_modules')} vs {warm_cfg.get('target_modules')})")
    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(model, str(warmup_adapter), adapter_name="warmup")
    peft_model.load_adapter(str(delta_adapter), adapter_name="grpo")
    peft_model.add_weighted_adapter(["warmup", "grpo"], [1.0, 1.0], "folded", combination_type="cat")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside ``out`` and renamed into place: a run killed while folding leaves no half adapter that
    # usable_adapter() would take (fold_missing() folds it again on resume).
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        peft_model.save_pretrained(tmp, selected_adapters=["folded"])
        saved = Path(tmp) / "folded"  # PEFT saves a non-default adapter in a folder of its name
        # Readers take the base from the base model folder they are given; the config names it for a person.
        config = json.loads((saved / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = str(base_model)
        (saved / "adapter_config.json").write_text(json.dumps(config, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(saved, out)
    return out


def fold_missing(checkpoint_dir: str | Path, base_model: str | Path, warmup_adapter: str | Path) -> list[Path]:
    """Fold every finished ``checkpoint-N`` under ``checkpoint_dir`` that has no ``on_base/`` yet (a run killed
    between a save and its fold); returns the folders written."""
    written = []
    for ckpt in sorted(Path(checkpoint_dir).glob("checkpoint-*")):
        if (ckpt / "adapter_config.json").is_file() and (ckpt / "trainer_state.json").is_file() \
                and not (ckpt / ON_BASE / "adapter_config.json").is_file():
            written.append(fold_onto_base(base_model, warmup_adapter, ckpt, ckpt / ON_BASE))
    if written:
        logger.info("folded %d checkpoint(s) onto the base: %s", len(written),
                    ", ".join(p.parent.name for p in written))
    return written


def fold_callback(base_model: str | Path, warmup_adapter: str | Path):
    """A ``transformers.TrainerCallback`` that folds each checkpoint onto the base right after the Trainer saved it."""
    from transformers import TrainerCallback

    class FoldCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                fold_missing(args.output_dir, base_model, warmup_adapter)

    return FoldCheckpoints()


__all__ = ["ON_BASE", "OVER_WARMUP", "fold_callback", "fold_missing", "fold_onto_base", "merged_warmup",
           "usable_adapter"]
