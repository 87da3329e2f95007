"""The house (issue 31): the old module paths still work for one release, and the rooms keep their walls.

* every deprecated path imports, warns with a DeprecationWarning that names its new path, and exposes the very
  objects of the new modules;
* ``import trace_envs`` loads neither torch nor trace_train (the env suite stays light);
* nothing below the CLI imports ``trace_train.commands``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: old module -> (the new module named in its warning, {name: new module that defines it}).
DEPRECATED = {
    "trace_train.models": ("trace_train.tiny.build", {
        "build_model": "trace_train.tiny.build", "PRESETS": "trace_train.tiny.build",
        "BootstrapConfig": "trace_train.tiny.bootstrap", "bootstrap_model": "trace_train.tiny.bootstrap",
        "train_tokenizer": "trace_train.tiny.tokenizer", "qwen3_chat_template": "trace_train.tiny.tokenizer",
        "sft_loss": "trace_train.tiny.sft_forward", "sft_rows": "trace_train.tiny.sft_data",
        "render_prompt": "trace_train.tiny.sft_data", "model_env_kwargs": "trace_train.tiny.metadata",
        "env_accepts": "trace_train.tiny.metadata", "CopyCircuit": "trace_train.tiny.copy_circuit"}),
    "trace_train.copy_circuit": ("trace_train.tiny.copy_circuit", {
        "CopyCircuit": "trace_train.tiny.copy_circuit", "install_copy_circuit": "trace_train.tiny.copy_circuit"}),
    "trace_train.fast_decode": ("trace_train.tiny.fast_decode", {"FastDecoder": "trace_train.tiny.fast_decode"}),
    "trace_train.grpo": ("trace_train.train.grpo", {
        "train": "trace_train.train.grpo", "read_log": "trace_train.train.grpo",
        "TrainConfig": "trace_train.train.config", "calibrate": "trace_train.train.calibration"}),
    "trace_train.train_config": ("trace_train.train.config", {
        "TrainConfig": "trace_train.train.config", "ConfigError": "trace_train.train.config"}),
    "trace_train.prefix_logprobs": ("trace_train.train.prefix_logprobs", {
        "shared_prefix_logprobs": "trace_train.train.prefix_logprobs"}),
    "trace_train.pipeline_config": ("trace_train.pipeline.config", {
        "load_config": "trace_train.pipeline.config", "RunConfig": "trace_train.pipeline.config"}),
    "trace_train.pipeline_stages": ("trace_train.pipeline.stages", {
        "run_base": "trace_train.pipeline.stages.base", "estimate_train": "trace_train.pipeline.stages.train",
        "run_evaluate": "trace_train.pipeline.stages.evaluate", "SAME_AS_BASE_NOTE": "trace_train.pipeline.stages.evaluate",
        "tiny_base_cache_dir": "trace_train.pipeline.stages.base", "MixtureAgent": "trace_train.pipeline.stages.common"}),
}


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_a_deprecated_path_warns_and_is_the_new_objects(old):
    named, names = DEPRECATED[old]
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert messages, f"importing {old} gave no DeprecationWarning"
    assert any(old in m and named.rsplit(".", 1)[0] in m for m in messages), messages
    for name, new in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(new), name), f"{old}.{name} is not {new}.{name}"
    for name in module.__all__:
        assert hasattr(module, name), f"{old}.__all__ names {name}, which it does not have"


def test_the_pipeline_package_exports_what_the_module_did():
    import trace_train.pipeline as pipeline
    from trace_train.pipeline import runner

    for name in ["Context", "Pipeline", "PipelineError", "PlanRow", "RunResult", "Stage", "format_plan", "path_digest"]:
        assert getattr(pipeline, name) is getattr(runner, name)


def test_import_trace_envs_loads_neither_torch_nor_trace_train():
    code = ("import sys, trace_envs; heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', "
            "'trace_train')); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.stdout.strip() == "[]", out.stdout


def _imports_commands(tree: ast.AST, package: str) -> list[int]:
    """Line numbers of the imports of trace_train.commands in a module of ``package`` (relative ones resolved)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if a.name.split(".")[:2] == ["trace_train", "commands"]]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            if any(n.split(".")[:2] == ["trace_train", "commands"] for n in names):
                lines.append(node.lineno)
    return lines


def test_nothing_below_the_cli_imports_the_commands():
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "build", "dist", ".git") or "fixtures" in rel.parts or "bad_modules" in rel.parts:
            continue
        if rel.as_posix() == "trace_train/cli.py" or rel.parts[:2] == ("trace_train", "commands"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        package = ".".join(rel.with_suffix("").parts[:-1]) if rel.name != "__init__.py" else ".".join(rel.parts[:-1])
        offenders += [f"{rel}:{n}" for n in _imports_commands(tree, package)]
    assert not offenders, f"imports of trace_train.commands below the CLI: {offenders}"


def test_nothing_in_the_project_imports_a_deprecated_path():
    old = {m.rsplit(".", 1)[1] for m in DEPRECATED}
    offenders = []
    for top in ("trace_train", "trace_envs", "generators", "bench", "scripts", "examples", "tests"):
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if rel.parts[:1] == ("trace_train",) and len(rel.parts) == 2 and rel.stem in old:
                continue  # the aliases themselves
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                if isinstance(node, ast.ImportFrom) and node.module == "trace_train" and not node.level:
                    mods += [f"trace_train.{a.name}" for a in node.names]  # from trace_train import models
                offenders += [f"{rel}:{node.lineno}" for m in mods if m in {f"trace_train.{o}" for o in old}]
    assert not offenders, f"imports of deprecated paths inside the project: {offenders}"
