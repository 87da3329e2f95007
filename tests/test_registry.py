"""Workspace registries: loading, and every rejection naming the file, the entry and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import trace_envs
from trace_envs import RegistryError, load_registry
from trace_envs.core import registry as registry_module
from trace_envs.core.registry import BUILTIN_REGISTRY, read_registry

ROOT = Path(__file__).resolve().parent.parent

ENV_MODULE = '''
from trace_envs import TraceEnv, tool
from trace_envs.core.conversation import hermes_tool_call


class EchoEnv(TraceEnv):
    """Say the secret word back to the user."""

    def _generate_task(self, options):
        self.word = ["alpha", "bravo", "charlie", "delta"][int(self.np_random.integers(4))]
        self.said = None
        return f"Call say with the word {self.word}."

    def task_spec(self):
        return {"word": self.word}

    def world_state(self):
        return {"said": self.said}

    @tool(write=True)
    def say(self, word: str) -> str:
        """Say a word; this ends the task.

        Args:
            word: the word.
        """
        self.said = word
        self._end("agent_stop")
        return "ok"

    def _evaluate(self):
        return float(self.said == self.word), {"said": self.said}

    def oracle(self):
        return lambda observation, info: hermes_tool_call("say", {"word": self.word})


class NotAnEnv:
    pass
'''


@pytest.fixture
def workspace(tmp_path: Path):
    """A fresh workspace folder with a uniquely named env module; cleans up what it registered."""
    module = f"ws_env_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(ENV_MODULE, encoding="utf-8")
    saved_path = list(sys.path)
    before = set(registry_module._ENTRIES)
    yield tmp_path, module
    for env_id in set(registry_module._ENTRIES) - before:
        registry_module._ENTRIES.pop(env_id)
        gym.registry.pop(env_id, None)
    sys.path[:] = saved_path
    sys.modules.pop(module, None)


def _entry(module: str, **overrides) -> dict:
    entry = {"id": f"ws/echo_{module[-6:]}-v0", "entry_point": f"{module}:EchoEnv", "kind": "capability",
             "capability": "echo", "max_episode_steps": 5, "requires": [], "kwargs": {},
             "origin": "hand-written", "description": "Echo a word."}
    entry.update(overrides)
    return {k: v for k, v in entry.items() if v is not ...}


def _write(folder: Path, entries) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "registry.yaml"
    path.write_text(yaml.safe_dump(entries, sort_keys=False), encoding="utf-8")
    return path


def test_workspace_registry_loads_and_makes(workspace) -> None:
    folder, module = workspace
    _write(folder, [_entry(module)])
    entries = load_registry(folder)  # a folder or its registry.yaml
    assert [e.id for e in entries] == [f"ws/echo_{module[-6:]}-v0"]
    entry = trace_envs.get_entry(entries[0].id)
    assert entry.source == str(folder / "registry.yaml") and entry.capability == "echo"
    assert entry.id in [e.id for e in trace_envs.registered()]

    env = gym.make(entry.id)  # the module next to registry.yaml imports by name
    assert env.spec.max_episode_steps == 5
    obs, info = env.reset(seed=1)
    assert "Call say with the word" in obs and info["tools"][0]["function"]["name"] == "say"
    env.close()
    assert trace_envs.rollout(entry.id, trace_envs.OracleAgent(), seed=3)["reward"] == 1.0

    # Loading the same file again, by another spelling of its path, is not a duplicate.
    assert load_registry(folder / "registry.yaml")[0].id == entry.id
    assert load_registry(str(folder / "." / "registry.yaml"))[0].id == entry.id


def test_import_entry_points_checks_the_class(workspace) -> None:
    folder, module = workspace
    _write(folder, [_entry(module)])
    assert read_registry(folder, import_entry_points=True)[0].load_class().__name__ == "EchoEnv"


def _rejected(path: Path, import_entry_points: bool = False) -> str:
    with pytest.raises(RegistryError) as info:
        read_registry(path, import_entry_points=import_entry_points)
    message = str(info.value)
    assert str(path) in message, message
    assert "Fix:" in message, message
    return message


@pytest.mark.parametrize("case,overrides,problem", [
    ("unknown kind", {"kind": "tool"}, "unknown kind 'tool'"),
    ("malformed id", {"id": "Echo Env"}, "malformed id 'Echo Env'"),
    ("id without version", {"id": "ws/echo"}, "malformed id 'ws/echo'"),
    ("missing field", {"description": ...}, "missing required field 'description'"),
    ("missing entry point", {"entry_point": ...}, "missing required field 'entry_point'"),
    ("unknown field", {"difficulty": 3}, "unknown field(s) ['difficulty']"),
    ("missing module", {"entry_point": "no_such_module_for_trace_tests:Env"},
     "entry_point module 'no_such_module_for_trace_tests' cannot be found"),
    ("malformed entry point", {"entry_point": "just_a_module"}, "malformed entry_point 'just_a_module'"),
    ("zero max_episode_steps", {"max_episode_steps": 0}, "max_episode_steps must be a positive integer, got 0"),
    ("string max_episode_steps", {"max_episode_steps": "ten"}, "max_episode_steps must be a positive integer"),
    ("boolean max_episode_steps", {"max_episode_steps": True}, "max_episode_steps must be a positive integer"),
    ("requires not a list", {"requires": "docker"}, "requires must be a list of strings"),
    ("kwargs not a mapping", {"kwargs": [1, 2]}, "kwargs must be a mapping"),
])
def test_bad_entry_is_rejected(workspace, case: str, overrides: dict, problem: str) -> None:
    folder, module = workspace
    good = _entry(module, id="ws/first-v0")
    bad = _entry(module, **overrides)
    path = _write(folder, [good, bad])
    message = _rejected(path)
    assert problem in message, message
    assert "entry #2" in message, message  # the entry, by position ...
    if isinstance(bad.get("id"), str):
        assert f"({bad['id']})" in message  # ... and by id when it has one


def test_duplicate_id_in_one_file(workspace) -> None:
    folder, module = workspace
    entry = _entry(module)
    message = _rejected(_write(folder, [entry, _entry(module, description="Another.")]))
    assert f"entry #2 ({entry['id']}): duplicate id (also entry #1)" in message


def test_duplicate_id_across_files(workspace) -> None:
    folder, module = workspace
    first = _write(folder, [_entry(module)])
    second = _write(folder / "two", [_entry(module, description="Same id, another file.")])
    load_registry(first)
    with pytest.raises(RegistryError) as info:
        load_registry(second)
    message = str(info.value)
    assert str(second) in message and str(first) in message and _entry(module)["id"] in message
    assert "duplicate id, already registered by" in message and "Fix:" in message


def test_duplicate_of_a_builtin_or_example_id(workspace) -> None:
    folder, module = workspace
    taken = trace_envs.registered()[0].id  # the example at least (tests/conftest.py)
    path = _write(folder, [_entry(module, id=taken)])
    with pytest.raises(RegistryError, match=r"duplicate id, already registered by .*Fix:"):
        load_registry(path)
    assert trace_envs.get_entry(taken).source != str(path)


def test_unimportable_module(workspace) -> None:
    folder, module = workspace
    (folder / f"{module}_broken.py").write_text("raise RuntimeError('boom at import')\n", encoding="utf-8")
    path = _write(folder, [_entry(module, entry_point=f"{module}_broken:EchoEnv")])
    message = _rejected(path, import_entry_points=True)
    assert "cannot be imported (RuntimeError: boom at import)" in message and "entry #1" in message


def test_entry_point_that_is_not_a_trace_env(workspace) -> None:
    folder, module = workspace
    message = _rejected(_write(folder, [_entry(module, entry_point=f"{module}:NotAnEnv")]), import_entry_points=True)
    assert "is not a TraceEnv subclass" in message


@pytest.mark.parametrize("content,problem", [
    ("id: ws/echo-v0\nkind: capability\n", "the top level must be a list of entries, got dict"),
    ("- [unclosed\n", "not valid YAML"),
    ("- just a string\n", "an entry must be a mapping, got str"),
])
def test_malformed_file_is_rejected(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(content, encoding="utf-8")
    assert problem in _rejected(path)


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    message = _rejected(tmp_path / "nowhere")
    assert "registry file not found" in message


def test_empty_file_is_an_empty_registry(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text("# nothing yet\n", encoding="utf-8")
    assert read_registry(path) == []


def test_builtin_registry_is_valid() -> None:
    """Every built-in entry imports fully and names a TraceEnv subclass."""
    for entry in read_registry(BUILTIN_REGISTRY, import_entry_points=True):
        assert entry.source == str(BUILTIN_REGISTRY)


def _lazy_id() -> tuple[str, dict]:
    """A built-in id needing no external resource if there is one, else the example via TRACE_REGISTRY."""
    for entry in read_registry(BUILTIN_REGISTRY):
        if not entry.requires:
            return entry.id, {}
    return "examples/warehouse_stock-v0", {"TRACE_REGISTRY": str(ROOT / "examples")}


def test_gym_make_with_module_prefix_imports_lazily() -> None:
    env_id, extra_env = _lazy_id()
    code = textwrap.dedent(f"""
        import json, sys
        import gymnasium as gym
        assert "trace_envs" not in sys.modules
        env = gym.make("trace_envs:{env_id}")
        obs, info = env.reset(seed=0)
        print(json.dumps({{"loaded": "trace_envs" in sys.modules, "id": env.spec.id,
                          "obs": isinstance(obs, str), "tools": len(info["tools"])}}))
        env.close()
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **extra_env}
    if not extra_env:
        env.pop("TRACE_REGISTRY", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"loaded": True, "id": env_id, "obs": True, "tools": result["tools"]}
    assert result["tools"] >= 1
