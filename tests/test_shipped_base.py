"""The warmed-up tiny base shipped with the project (``trace_train/tiny/bases/``).

The embedded default's recipe gives the shipped base's cache name, so ``trace run`` installs it instead of
warming up; it loads offline with ``transformers``; a config whose recipe differs does not match it and
warms up a new base instead.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trace_train.pipeline.config import embedded_default
from trace_train.pipeline.stages.base import _cached_base, shipped_roots, tiny_base_cache_dir, tiny_bootstrap_config
from trace_train.tiny.shipped import find_shipped_base, install_shipped_base, shipped_bases


def _default_bcfg():
    cfg = embedded_default()
    return tiny_bootstrap_config(cfg.base, cfg.rollout.targets[0])


@pytest.mark.parametrize("config", [None, "lab/headline-planted/config.yaml"])
def test_each_shipped_recipe_matches_its_shipped_base(config):
    """The embedded default's and the planted config's warm-ups find their shipped base, the planted one through
    its ``base.shipped`` folder beside the config (a settings field added to the warm-up later must not change the
    cache name while left at its default)."""
    from pathlib import Path

    from trace_train.pipeline.config import load_config
    from trace_train.tiny.bootstrap import keyed_settings

    cfg = load_config(Path(__file__).resolve().parent.parent / config) if config else embedded_default()
    bcfg = tiny_bootstrap_config(cfg.base, cfg.rollout.targets[0])
    shipped = find_shipped_base(tiny_base_cache_dir(bcfg).name, shipped_roots(cfg.base))
    assert shipped is not None, [b.cache_name for b in shipped_bases(shipped_roots(cfg.base))]
    recipe = shipped.recipe
    # The recipe written beside the model is the config's warm-up, field for field.
    expected = {k: v for k, v in keyed_settings(bcfg).items() if k != "out"}
    assert json.loads(json.dumps(expected, default=list)) == recipe["bootstrap"]
    assert recipe["solve_rate"]["episodes"] in (40, 80) and 0 <= recipe["solve_rate"]["solved"] <= 80
    size = sum(p.stat().st_size for p in shipped.path.iterdir())
    assert size <= 25 * 2**20, size


def test_the_shipped_base_loads_offline_and_writes_a_tool_call():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped = find_shipped_base(tiny_base_cache_dir(_default_bcfg()).name)
    tok = AutoTokenizer.from_pretrained(shipped.path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(shipped.path, local_files_only=True)
    meta = json.loads((shipped.path / "trace_model.json").read_text())
    assert meta["bootstrap"]["steps"] == shipped.recipe["bootstrap"]["steps"]
    # TRL's Qwen3 chat template, byte for byte, so TRL's tool-call parser works on it.
    from trace_train.tiny.tokenizer import qwen3_chat_template

    assert tok.chat_template == qwen3_chat_template()
    ids = tok("<|im_start|>assistant\n", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_install_copies_it_into_the_cache_and_a_changed_recipe_warms_up_instead(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_CACHE", str(tmp_path))
    bcfg = _default_bcfg()
    path = tiny_base_cache_dir(bcfg)
    assert str(path).startswith(str(tmp_path))
    assert not _cached_base(path)
    installed = install_shipped_base(path)
    assert installed is not None and _cached_base(path)
    assert not list(tmp_path.glob("models/*.partial"))
    other = replace(bcfg, steps=bcfg.steps + 1)
    assert tiny_base_cache_dir(other).name != path.name
    assert find_shipped_base(tiny_base_cache_dir(other).name) is None
    assert install_shipped_base(tiny_base_cache_dir(other)) is None


def test_the_base_stage_estimate_says_shipped_or_warm_up(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_CACHE", str(tmp_path))
    from trace_train.pipeline.stages.base import estimate_base

    class Ctx:
        def __init__(self, cfg):
            self.cfg = cfg

    seconds, why = estimate_base(Ctx(embedded_default()))
    assert "shipped" in why and seconds < 10
    changed = embedded_default()
    changed.base.bootstrap = {**changed.base.bootstrap, "steps": 7}
    seconds, why = estimate_base(Ctx(changed))
    assert "warm-up" in why and seconds > 10


@pytest.mark.parametrize("config", [None, "lab/headline-planted/config.yaml"])
def test_a_warm_up_estimate_is_near_what_the_shipped_warm_up_measured(tmp_path, monkeypatch, config):
    """The estimate of a recipe one step longer than a shipped base's is within 1.5x of that base's measured time."""
    monkeypatch.setenv("TRACE_CACHE", str(tmp_path))
    from pathlib import Path

    from trace_train.pipeline.config import load_config
    from trace_train.pipeline.stages.base import estimate_base

    class Ctx:
        def __init__(self, cfg):
            self.cfg = cfg

    cfg = load_config(Path(__file__).resolve().parent.parent / config) if config else embedded_default()
    shipped = find_shipped_base(tiny_base_cache_dir(tiny_bootstrap_config(cfg.base, cfg.rollout.targets[0])).name,
                                shipped_roots(cfg.base))
    assert shipped is not None  # both recipes are shipped (the planted one beside its config)
    cfg.base.bootstrap = {**cfg.base.bootstrap, "steps": cfg.base.bootstrap["steps"] + 1}
    seconds, why = estimate_base(Ctx(cfg))
    measured = shipped.recipe["warmup"]["train_seconds"]
    assert "warm-up" in why and measured / 1.5 < seconds < measured * 1.5, (seconds, measured)


@pytest.mark.parametrize("bad", ["{}", "not json"])
def test_a_bad_recipe_file_is_a_clear_error(tmp_path, bad, capsys):
    from trace_train import cli

    recipe = tmp_path / "recipe.json"
    recipe.write_text(bad)
    assert cli.main(["model", "bootstrap", "--recipe", str(recipe)]) == 2
    assert "not a shipped base's recipe.json" in capsys.readouterr().err


def test_an_experiment_base_is_found_only_through_its_config(tmp_path, monkeypatch):
    """The planted base is not in the package: without ``base.shipped`` its recipe would warm up; with it, the
    base stage installs it from the experiment's folder, and a missing folder is a clear error."""
    from pathlib import Path

    from trace_train.pipeline.config import ConfigError, load_config
    from trace_train.pipeline.stages.base import estimate_base
    from trace_train.tiny.shipped import BASES

    monkeypatch.setenv("TRACE_CACHE", str(tmp_path))
    root = Path(__file__).resolve().parent.parent
    assert [b.name for b in shipped_bases()] == ["embedded-default"]
    cfg = load_config(root / "lab/headline-planted/config.yaml")
    assert Path(cfg.base.shipped) == root / "lab/headline-planted/bases"
    name = tiny_base_cache_dir(tiny_bootstrap_config(cfg.base, cfg.rollout.targets[0])).name
    assert find_shipped_base(name) is None and find_shipped_base(name, [BASES, Path(cfg.base.shipped)])
    with_folder = cfg.section_hash("base")
    cfg.base.shipped = None
    assert cfg.section_hash("base") == with_folder  # where the base comes from is no part of the fingerprint

    class Ctx:
        def __init__(self, cfg):
            self.cfg = cfg

    seconds, why = estimate_base(Ctx(cfg))
    assert "warm-up" in why
    cfg.base.shipped = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="base.shipped"):
        shipped_roots(cfg.base)
    assert estimate_base(Ctx(cfg))[0] is None
