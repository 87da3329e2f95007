"""Generated envs run out of process, sandboxed, at every use (docs/design.md, "Sandboxing").

* ``gym.make`` of a generated id returns the proxy (:class:`trace_envs.core.sandboxed.SandboxedEnv`);
  its trajectories are the in-process env's, step for step, and the conformance suite passes on it;
* a worker that dies, hangs or breaks a limit ends the episode with ``env_error`` and never raises;
* the attacking modules of ``tests/bad_modules/`` marked ``# attack: use``, installed straight into a
  workspace as if the static filter had missed them, are harmless when played through ``gym.make``: no
  file outside their scratch dir, no process outliving the worker, no connection, the trainer's modules
  (the target's evaluator, ``gymnasium.make``, the registry) unchanged, no secret in what they return;
* without bubblewrap a generated env refuses to run unless running unsandboxed is asked for.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import child_pids

import trace_envs
from generators.offline import render
from generators.static import static_check
from generators.workspace import Workspace
from trace_envs import OracleAgent, RandomAgent, rollout
from trace_envs.core import registry, sandboxed, wire
from trace_envs.core.sandboxed import SandboxedEnv, SandboxUnavailable
from trace_envs.domains.agents import TauScriptedAgent

pytestmark = pytest.mark.usefixtures("restore_registry")

CORPUS = Path(__file__).resolve().parent / "bad_modules"
ATTACKS = sorted(p for p in CORPUS.glob("*.py") if "# attack: use" in p.read_text(encoding="utf-8")[:400])
LEAKS = [Path("/tmp/trace_bad_module_wrote_this"), Path("/tmp/trace_bad_module_wrote_this.npy")]
LISTENER_PORT = 47391  # what tests/bad_modules/connects_out.py tries to reach
SECRET = "trace-test-secret-3b9f7c"


def _install(tmp_path: Path, source: str, origin: str = "generated:test", sandbox: bool | None = None) -> str:
    """Put ``source`` into a fresh workspace as an admitted env would be (no admission: the filter "missed" it)."""
    _, registration = static_check(source)
    assert registration is not None
    ws = Workspace(tmp_path / "ws")
    ws.install(source, registration, capability="precondition_verification", name="precondition_verification_tau_"
               "airline", version=0, target="tau_airline", origin=origin)
    if sandbox is not None:
        text = ws.registry.read_text().rstrip("\n") + f"\n  sandbox: {json.dumps(sandbox)}\n"
        ws.registry.write_text(text)
    trace_envs.load_registry(ws.root)
    return registration["id"]


def _offline_source(capability: str = "precondition_verification", domain: str = "airline") -> str:
    spec = {"name": capability, "target_env": f"trace/tau_{domain}-v0", "statistics": {"coverage": 0.3}}
    return render(spec, env_id=f"gen/{capability}_tau_{domain}-v0", run_id="test").source


def _in_process(env_id: str, tmp_path: Path):
    """The same module built in this process (only the test does this; the trainer never does)."""
    import importlib.util

    entry = trace_envs.get_entry(env_id)
    module_name, _, cls = entry.entry_point.partition(":")
    path = tmp_path / "ws" / (module_name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(f"_test_in_process_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # under a private name: nothing the proxy could pick up
    env = getattr(module, cls)(**entry.kwargs)
    return gym.wrappers.TimeLimit(env, max_episode_steps=entry.max_episode_steps)



def _marked_processes(marker: bytes = b"31337") -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


# ------------------------------------------------------------------------------------------------ the proxy
def test_a_workspace_loaded_by_a_relative_path_still_starts_its_worker(tmp_path, monkeypatch):
    """`trace run --out runs/demo` loads runs/demo/workspace by a relative path; the worker's sandbox binds
    the module's folder by path, so the spec must carry it absolute (a fresh-clone demo once died here with
    `bwrap: Can't find source path runs/demo/workspace/envs`)."""
    source = _offline_source()
    _, registration = static_check(source)
    Workspace(tmp_path / "ws").install(source, registration, capability="precondition_verification",
                                       name="precondition_verification_tau_airline", version=0,
                                       target="tau_airline", origin="generated:test")
    env_id = registration["id"]
    monkeypatch.chdir(tmp_path)
    trace_envs.load_registry("ws")  # relative, as `trace run --out runs/demo` loads its workspace
    spec = registry.worker_spec(trace_envs.get_entry(env_id))
    assert Path(spec.module_root).is_absolute() and Path(spec.bind).is_absolute()
    env = gym.make(env_id)
    try:
        assert rollout(env, OracleAgent(), seed=3)["reward"] == 1.0
    finally:
        env.close()


def test_gym_make_of_a_generated_id_is_the_proxy_and_never_imports_the_module(tmp_path):
    env_id = _install(tmp_path, _offline_source())
    entry = trace_envs.get_entry(env_id)
    assert entry.sandbox and entry.generated
    # what the trainer reads of the class (the hint text, the constructor's arguments) without importing it
    from trace_train.tiny.metadata import env_accepts
    from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

    cls = entry.load_class()
    assert issubclass(cls, SandboxedEnv) and cls.hint_text == getattr(PreconditionVerificationEnv, "hint_text", None)
    assert env_accepts(env_id, "prompt") and env_accepts(env_id, "difficulty") and not env_accepts(env_id, "nope")
    env = gym.make(env_id)
    try:
        assert isinstance(env.unwrapped, SandboxedEnv) and env.spec.max_episode_steps == entry.max_episode_steps
        record = rollout(env, OracleAgent(), seed=7)
        assert record["reward"] == 1.0 and record["termination"] != "env_error"
        assert env.unwrapped.open_resources()  # the worker runs until close
    finally:
        env.close()
    assert env.unwrapped.open_resources() == []
    assert not [m for m in sys.modules if m.startswith("envs.")]  # the module stayed in the worker


@pytest.mark.parametrize("capability,domain", [("precondition_verification", "airline"),
                                               ("multi_step_completion", "retail")])
def test_offline_generated_envs_give_the_same_trajectories_through_the_proxy(tmp_path, capability, domain):
    source = _offline_source(capability, domain)
    env_id = _install(tmp_path, source.replace("precondition_verification_tau_airline", f"{capability}_tau_{domain}"))
    proxy, local = gym.make(env_id), _in_process(env_id, tmp_path)
    try:
        assert proxy.observation_space == local.observation_space and proxy.action_space == local.action_space
        for seed in (3, 4_000_000_017):
            for make_agent in (OracleAgent, lambda: TauScriptedAgent([capability]), lambda: RandomAgent(seed)):
                a, b = rollout(proxy, make_agent(), seed=seed), rollout(local, make_agent(), seed=seed)
                for key in ("messages", "tools", "reward", "reward_breakdown", "success", "termination", "steps",
                            "task"):
                    assert a[key] == b[key], (seed, a["agent"], key)
        # seeding: the proxy's np_random follows the env's; a reset without a seed continues both streams
        proxy.reset(seed=11)
        local.reset(seed=11)
        assert proxy.unwrapped.np_random.bit_generator.state == local.unwrapped.np_random.bit_generator.state
        assert proxy.reset()[0] == local.reset()[0]
        assert proxy.unwrapped.task_fingerprint() == local.unwrapped.task_fingerprint()
        assert proxy.unwrapped.task_spec() == local.unwrapped.task_spec()
        assert proxy.unwrapped.task_info() == local.unwrapped.task_info()
        # what the TRL adapter and the write-all probe read of the toolset
        ours, theirs = proxy.unwrapped._toolset, local.unwrapped._toolset
        assert {n: s.defaults for n, s in ours.specs.items()} == {n: s.defaults for n, s in theirs.specs.items()}
        names = [t["function"]["name"] for t in proxy.unwrapped.tools]
        assert [ours.is_write(n) for n in names] == [theirs.is_write(n) for n in names]
        assert any(map(ours.is_write, names))
    finally:
        proxy.close()
        local.close()


def test_conformance_suite_passes_through_the_proxy(tmp_path):
    env_id = _install(tmp_path, _offline_source())
    report = trace_envs.check_trace_env(env_id, seeds=[5, 123_456_789, 2 ** 31 + 7])
    report.raise_if_failed()


def test_a_hand_written_entry_may_opt_in_and_a_generated_one_cannot_opt_out(tmp_path):
    env_id = _install(tmp_path / "a", _offline_source(), origin="hand-written", sandbox=True)
    assert trace_envs.get_entry(env_id).sandbox
    env = gym.make(env_id)
    assert isinstance(env.unwrapped, SandboxedEnv)
    env.close()
    with pytest.raises(trace_envs.RegistryError, match="cannot opt out"):
        _install(tmp_path / "b", _offline_source(), sandbox=False)
    assert not trace_envs.get_entry("trace/tau_airline-v0").sandbox  # built-ins stay in process


BROKEN = r'''from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv
import os
import sys

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"}, "description": "breaks on cue"}


class BadEnv(PreconditionVerificationEnv):
    def step(self, action):
        if action == "die":
            os._exit(3)
        if action == "hang":
            while True:
                pass
        if action == "eat":
            blob = bytearray(64 * 1024 ** 3)
        if action == "raise":
            raise RuntimeError("boom")
        if action == "lie":
            os.write(int(sys.argv[-1]), b"this is not the protocol\n")  # the reply pipe: garbage on it
        if action in LIMIT_ATTACKS:
            raise RuntimeError(LIMIT_ATTACKS[action]())
        return super().step(action)


def _fill(folder, size, count):
    """Write up to ``count`` files of ``size`` bytes into ``folder``; what got written, and what stopped it."""
    wrote, block = 0, b"x" * (1 << 20)
    try:
        for i in range(count):
            with open(os.path.join(folder, f"f{i}"), "wb") as fh:
                for _ in range(size >> 20):
                    fh.write(block)
                    fh.flush()
                    wrote += len(block)
    except OSError as exc:
        return f"wrote {wrote >> 20} MB in {folder}, stopped by {exc.strerror}"
    return f"wrote {wrote >> 20} MB in {folder}, unstopped"


def _burn():
    x = 0
    while True:
        x += 1


LIMIT_ATTACKS = {"fill_scratch": lambda: _fill("/tmp", 10 << 20, 50), "big_file": lambda: _fill("/tmp", 200 << 20, 1),
                 "fill_root": lambda: _fill("/", 1 << 20, 2), "fill_dev": lambda: _fill("/dev", 1 << 20, 2),
                 "fill_shm": lambda: _fill("/dev/shm", 1 << 20, 2), "burn_cpu": _burn}
'''


@pytest.mark.parametrize("action,reason", [("die", "exited with status 3"), ("hang", "timed out"),
                                           ("eat", "MemoryError"), ("raise", "RuntimeError: boom"),
                                           ("lie", "protocol")])
def test_a_failing_worker_ends_the_episode_with_env_error_and_the_next_reset_recovers(tmp_path, action, reason):
    env_id = _install(tmp_path, BROKEN)
    env = gym.make(env_id, trace_limits={"call_timeout_s": 3.0, "memory_mb": 1024})
    pid = env.unwrapped.worker_pid
    try:
        env.reset(seed=1)
        obs, reward, terminated, truncated, info = env.step(action)  # never raises
        assert terminated and reward == 0.0 and info["termination"] == "env_error"
        assert reason in info["env_error"], info["env_error"]
        assert env.observation_space.contains(obs) and "environment failed" in obs
        assert env.step("hello")[4]["termination"] == "env_error"  # the episode stays ended
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
        obs, info = env.reset(seed=2)  # a fresh worker
        assert env.unwrapped.worker_pid != pid
        assert "termination" not in info and env.step("Hello!")[4].get("termination") != "env_error"
    finally:
        env.close()


@pytest.mark.parametrize("action,reason", [
    # 50 files of 10 MB (each under the file-size limit): the tmpfs size stops them at 32 MB in all
    ("fill_scratch", r"wrote (\d+) MB in /tmp, stopped by No space left on device"),
    ("big_file", r"wrote (\d+) MB in /tmp, stopped by File too large"),  # RLIMIT_FSIZE: 16 MB
    ("fill_root", r"wrote (0) MB in /, stopped by Read-only file system"),
    ("fill_dev", r"wrote (0) MB in /dev, stopped by Read-only file system"),
    ("fill_shm", r"wrote (0) MB in /dev/shm, stopped by Read-only file system"),
    ("burn_cpu", r"SIGXCPU \(its CPU-time limit\)()")])
def test_a_module_that_tries_to_exceed_a_limit_is_stopped_by_it(tmp_path, action, reason):
    """Every resource limit, against a module that tries to exceed it: the scratch tmpfs's size (host shared
    memory, which RLIMIT_AS does not count), the file size, the read-only root and /dev, the CPU time. (The
    memory limit: the ``eat`` case above; RLIMIT_NPROC is not enforced by the kernel for root, and the pid
    namespace ends every process at close: tests/bad_modules/setsid_daemon.py.)"""
    import re

    env_id = _install(tmp_path, BROKEN)
    limits = {"tmpfs_mb": 32, "file_mb": 16, "call_timeout_s": 30.0, "cpu_s": 3}
    if not sandboxed.bwrap_status()[0]:
        pytest.skip("bubblewrap is not usable here (make setup installs it)")
    env = gym.make(env_id, trace_limits=limits)
    try:
        env.reset(seed=1)
        info = env.step(action)[4]
        assert info["termination"] == "env_error"
        m = re.search(reason, info["env_error"])
        assert m, info["env_error"]
        if action == "fill_scratch":
            assert int(m.group(1)) <= limits["tmpfs_mb"]
        if action == "big_file":
            assert int(m.group(1)) <= limits["file_mb"]
        assert env.reset(seed=2)[1].get("termination") != "env_error"  # a fresh worker, a fresh scratch
    finally:
        env.close()


def test_without_bubblewrap_a_generated_env_refuses_unless_both_switches_are_given(tmp_path, monkeypatch):
    """Unsandboxed, generated code runs as the user: TRACE_UNSANDBOXED alone does not run it (it runs only
    hand-written ``sandbox: true`` entries unsandboxed); TRACE_UNSANDBOXED_GENERATED must be given too. What the
    worker is handed is the scrubbed environment, not the trainer's."""
    env_id = _install(tmp_path / "gen", (CORPUS / "reads_secrets.py").read_text(encoding="utf-8"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.setenv("TRACE_TEST_SECRET", SECRET)
    monkeypatch.delenv(sandboxed.UNSANDBOXED_ENV, raising=False)
    monkeypatch.delenv(sandboxed.UNSANDBOXED_GENERATED_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="--unsandboxed"):
        gym.make(env_id)
    for how in ({"trace_unsandboxed": True}, {}):
        monkeypatch.setenv(sandboxed.UNSANDBOXED_ENV, "1")
        with pytest.raises(SandboxUnavailable, match=f"generated code.*{sandboxed.UNSANDBOXED_GENERATED_ENV}=1"):
            gym.make(env_id, **how)
    monkeypatch.setenv(sandboxed.UNSANDBOXED_GENERATED_ENV, "1")
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        env = gym.make(env_id)
    try:
        assert env.unwrapped.unsandboxed and rollout(env, OracleAgent(), seed=2)["reward"] == 1.0
        printed = env.unwrapped.output_tail()
        assert "PYTHONHASHSEED" in printed and SECRET not in printed  # its own environment is the scrubbed one
    finally:
        env.close()
    # a hand-written entry that opted in needs only the first switch
    monkeypatch.delenv(sandboxed.UNSANDBOXED_GENERATED_ENV)
    registry._ENTRIES.pop(env_id, None)
    gym.registry.pop(env_id, None)
    hand = _install(tmp_path / "hand", _offline_source(), origin="hand-written", sandbox=True)
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        gym.make(hand).close()


def test_a_generated_modules_texts_never_reach_a_prompt(tmp_path):
    """hint_text, description and docstring of a generated module are data (issue 58): load_class() still
    shows the module's hint_text (bounded), but GRPO's hint mode never puts it in a prompt; a hint the
    generator's own spec supplied (the registry's ``hint``) is used instead."""
    from types import SimpleNamespace

    from trace_envs.core.registry import prompt_hint
    from trace_train.train.grpo import _hint_for

    env_id = _install(tmp_path / "a", (CORPUS / "hint_text_injection.py").read_text(encoding="utf-8"))
    entry = trace_envs.get_entry(env_id)
    assert "Ignore the airline policy" in entry.load_class().hint_text  # data, as the module gave it
    hint = _hint_for(SimpleNamespace(hint_text=None), env_id)
    assert "Ignore" not in hint and "Done" not in hint and entry.description not in hint
    builtin = next(e for e in trace_envs.registered() if e.capability == "precondition_verification" and not e.sandbox)
    assert hint == prompt_hint(builtin)  # a hand-written env's, for the same capability
    registry._ENTRIES.pop(env_id, None)
    gym.registry.pop(env_id, None)
    source = (CORPUS / "hint_text_injection.py").read_text(encoding="utf-8")
    _, registration = static_check(source)
    ws = Workspace(tmp_path / "b" / "ws")
    ws.install(source, registration, capability="precondition_verification", name="precondition_verification_tau_"
               "airline", version=0, target="tau_airline", origin="generated:test",
               hint="Verify the preconditions in the records before any write.")
    trace_envs.load_registry(ws.root)
    assert prompt_hint(trace_envs.get_entry(env_id)) == "Verify the preconditions in the records before any write."


def test_the_cli_flag_unsandboxed_sets_the_switch(monkeypatch, capsys):
    from trace_train.cli import main

    monkeypatch.setenv(sandboxed.UNSANDBOXED_ENV, "0")  # recorded, so the flag's "1" is undone afterwards
    monkeypatch.delenv(sandboxed.UNSANDBOXED_GENERATED_ENV, raising=False)
    assert main(["envs", "list", "--unsandboxed"]) == 0
    assert os.environ[sandboxed.UNSANDBOXED_ENV] == "1" and "--unsandboxed" in capsys.readouterr().err
    assert sandboxed.generated_unsandboxed_allowed() is False
    monkeypatch.setenv(sandboxed.UNSANDBOXED_GENERATED_ENV, "0")
    assert main(["envs", "list", "--unsandboxed", "--unsandboxed-generated"]) == 0
    assert sandboxed.generated_unsandboxed_allowed() and "--unsandboxed-generated" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ attacks at use
@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records every connection it gets."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", LISTENER_PORT))
    server.listen(8)
    server.settimeout(0.2)
    got: list = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                got.append(conn.recv(1000))
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield got
    stop.set()
    thread.join(2)
    server.close()


@pytest.mark.parametrize("path", ATTACKS, ids=[p.stem for p in ATTACKS])
def test_an_attacking_module_is_harmless_at_use(path, tmp_path, monkeypatch, listener):
    from trace_envs.core import checker
    from trace_envs.domains import base

    monkeypatch.setenv("TRACE_TEST_SECRET", SECRET)  # planted in the trainer's environment
    for leak in LEAKS:
        leak.unlink(missing_ok=True)
    before = {"make": gym.make, "registration.make": gym.envs.registration.make, "evaluate_task": base.evaluate_task,
              "_evaluate": base.TauEnv.__dict__["_evaluate"], "checks": list(checker.CHECKS),
              "tau spec": gym.spec("trace/tau_airline-v0").entry_point}
    ids_before = set(gym.registry)
    children = child_pids()
    env_id = _install(tmp_path, path.read_text(encoding="utf-8"))
    ws_files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    env = gym.make(env_id)
    pid = env.unwrapped.worker_pid
    try:
        records = [rollout(env, agent, seed=s) for s in (1, 2) for agent in (OracleAgent(), RandomAgent(s))]
    finally:
        env.close()
    seen = json.dumps(records, ensure_ascii=False) + env.unwrapped.output_tail()
    # what it could write into its scratch stayed within the scratch tmpfs's size
    import re

    assert all(int(mb) <= sandboxed.SandboxLimits().tmpfs_mb for mb in re.findall(r"wrote (\d+) MB", seen))
    # no secret reached it: not the planted variable, not /etc/passwd, not the user's keys
    assert SECRET not in seen and "root:x:0:0" not in seen and "PRIVATE KEY" not in seen
    assert "TRACE_TEST_SECRET" not in seen
    # no file outside its scratch dir, none in the workspace
    assert not [p for p in LEAKS if p.exists()]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == ws_files
    # no process outlived the worker
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/status").read_text().find("zombie") >= 0
    assert _marked_processes() == [] and child_pids() <= children
    # no connection was made
    assert listener == []
    # the trainer's modules are unchanged
    after = {"make": gym.make, "registration.make": gym.envs.registration.make, "evaluate_task": base.evaluate_task,
             "_evaluate": base.TauEnv.__dict__["_evaluate"], "checks": list(checker.CHECKS),
             "tau spec": gym.spec("trace/tau_airline-v0").entry_point}
    assert after == before
    assert set(gym.registry) - ids_before == {env_id}
    # ... and the target still pays nothing for a goodbye
    assert rollout("trace/tau_airline-v0", lambda obs, info: "Goodbye.", seed=1)["reward"] == 0.0
    assert not [m for m in sys.modules if m.startswith("envs.")]


# ------------------------------------------------------------------------------------------------ the wire
def test_the_wire_carries_what_json_cannot_exactly():
    deep: object = {}
    for _ in range(5_000):
        deep = {"a": deep}
    values = [10 ** 5_000, deep, ("t", (1, 2)), {1: "int key", (2, 3): "tuple key"}, "\ud800 lone", -0.0,
              float("inf"), [None, True, 1.5, "x" * 10], {"role": "assistant", "content": "hi"}]
    for value in values:
        back = wire.unpack(json.loads(wire.encode({"id": 1, "v": wire.pack(value)}).decode("utf-8", "surrogatepass"))
                           ["v"])
        if value is deep:
            depth = 0
            while back:
                back, depth = back["a"], depth + 1
            assert depth == 5_000
        else:
            assert back == value and type(back) is type(value), value
    odd = wire.unpack(json.loads(json.dumps(wire.pack(object()))))
    assert isinstance(odd, wire.Opaque) and "object" in repr(odd)
    with pytest.raises(wire.WireError):
        wire.decode(b"not json")
    with pytest.raises(wire.WireError):
        wire.space_from_wire({"type": "unicode_text", "min_length": 5, "max_length": 1})


def test_info_deltas_rebuild_every_info():
    sender, receiver = wire.InfoSender(), wire.InfoReceiver()
    messages = [{"role": "user", "content": "a"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    infos = [{"messages": list(messages), "tools": tools}]
    messages.append({"role": "assistant", "content": "b"})
    infos.append({"messages": list(messages), "tools": tools, "success": True, "reward_breakdown": {"x": 1}})
    infos.append({"messages": [{"role": "user", "content": "rewritten"}], "tools": []})
    for info in infos:
        delta = json.loads(json.dumps(sender.delta(info)))
        assert receiver.apply(delta) == info and list(receiver.apply(delta)) == list(info)
    assert "tools" not in sender.delta({"messages": [], "tools": []})  # unchanged tools are not sent again


def _plain(env_id: str) -> dict:
    """The entry's worker, explicitly unsandboxed (a plain subprocess)."""
    return {**registry.worker_spec(trace_envs.get_entry(env_id)).to_dict(), "sandbox": "none"}


def test_the_same_attacks_without_the_sandbox_do_reach_the_machine(tmp_path, monkeypatch):
    """The control of the test above: played unsandboxed, two of the attacks do what they try, so the
    checks above would see it (the sandbox, not a failed attack, is why they pass)."""
    monkeypatch.setenv(sandboxed.UNSANDBOXED_GENERATED_ENV, "1")
    LEAKS[0].unlink(missing_ok=True)
    try:
        env_id = _install(tmp_path / "files", (CORPUS / "attrgetter_os.py").read_text(encoding="utf-8"))
        with pytest.warns(RuntimeWarning):
            env = gym.make(env_id, trace_worker=_plain(env_id))
        env.reset(seed=1)
        env.close()
        assert LEAKS[0].exists()
    finally:
        LEAKS[0].unlink(missing_ok=True)
    registry._ENTRIES.pop(env_id, None)
    gym.registry.pop(env_id, None)
    env_id = _install(tmp_path / "secrets", (CORPUS / "reads_secrets.py").read_text(encoding="utf-8"))
    with pytest.warns(RuntimeWarning):
        env = gym.make(env_id, trace_worker=_plain(env_id))
    obs, _ = env.reset(seed=1)
    env.close()
    assert "root:x:0:0" in obs


def test_a_pool_keeps_the_sandbox_workers_from_one_rollout_call_to_the_next(tmp_path):
    """What a GRPO run does each step: run_rollouts with the run's EnvPool. The second call plays on the workers the
    first one started (the same processes), and its episodes are the ones fresh envs give."""
    from trace_train.rollouts import EnvPool, run_rollouts

    env_id = _install(tmp_path, _offline_source())
    fresh = run_rollouts(env_id, OracleAgent(), seeds=range(4), in_flight=4, progress=False, keep_records=True)
    with EnvPool() as pool:
        first = run_rollouts(env_id, OracleAgent(), seeds=range(4), in_flight=4, progress=False, keep_records=True,
                             env_pool=pool)
        envs = [e for free in pool._free.values() for e in free]
        pids = sorted(e.unwrapped._worker.proc.pid for e in envs)
        assert pool.made == 4 and len(pids) == 4
        second = run_rollouts(env_id, OracleAgent(), seeds=range(4), in_flight=4, progress=False, keep_records=True,
                              env_pool=pool)
        assert pool.made == 4  # nothing new was made ...
        assert sorted(e.unwrapped._worker.proc.pid for free in pool._free.values() for e in free) == pids  # or started
        assert all(e.unwrapped._worker.alive() for e in envs)
    assert all(e.unwrapped._worker is None for e in envs)  # the pool closed them

    def trajectories(summary):
        return sorted((r["seed"], r["reward"], json.dumps(r["messages"])) for r in summary.records)

    assert trajectories(first) == trajectories(second) == trajectories(fresh)
    assert all(r["success"] for r in fresh.records)
