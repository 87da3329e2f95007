"""The ``ray`` rollout backend on a real one-node Ray cluster (shared by the module; docs/ray.md).

The same trajectory file as the local backend; an actor killed mid-run and a driver killed mid-run, each
episode still in the file exactly once; bad episodes recorded as ``env_error``; bad config values refused
before any work; Ray never imported without ``--ray``. The SWE test (containers on the actors, none left)
needs Docker and runs last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="pip install 'trace-rl[ray]'")

from trace_envs import OracleAgent  # noqa: E402
from trace_train.backends import RolloutJob, run_jobs  # noqa: E402
from trace_train.backends.ray_backend import RayBackendError  # noqa: E402
from trace_train.pipeline.config import ConfigError, RaySection, config_from_dict  # noqa: E402
from trace_train.rollouts import read_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures"
TAU = "trace/tau_airline-v0"
# Four actors of half a CPU share the module's two CPUs, as a cluster's fractional actors would.
RAY = RaySection(num_actors=4, env_cpus=0.5, max_concurrent_per_actor=4)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # The agents defined here must reach the actors by value: this module is not importable there.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, resources={"docker": 2}, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _job(out: Path, make=OracleAgent, seeds=range(40), **kw) -> RolloutJob:
    return RolloutJob(key="oracle", make=make, targets=[TAU], seeds=list(seeds), out=out, in_flight=8,
                      progress=False, **kw)


def _by_key(path: Path) -> dict:
    records = read_trajectories(path)
    counts = Counter((r["env_id"], r["seed"], r["sample"]) for r in records)
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
    return {(r["env_id"], r["seed"], r["sample"]): r for r in records}


def test_local_and_ray_write_the_same_episodes(tmp_path):
    [local] = run_jobs([_job(tmp_path / "local.jsonl")], "local")
    [remote] = run_jobs([_job(tmp_path / "ray.jsonl")], "ray", ray=RAY)
    assert (local.ran, remote.ran, remote.actor_deaths) == (40, 40, 0)
    a, b = _by_key(tmp_path / "local.jsonl"), _by_key(tmp_path / "ray.jsonl")
    assert sorted(a) == sorted(b) == [(TAU, s, 0) for s in range(40)]
    for key in a:
        assert a[key]["messages"] == b[key]["messages"], key
        assert (a[key]["reward"], a[key]["termination"], a[key]["agent"]) == \
            (b[key]["reward"], b[key]["termination"], b[key]["agent"])
    # A rerun finds every episode in the file and starts nothing.
    [again] = run_jobs([_job(tmp_path / "ray.jsonl")], "ray", ray=RAY)
    assert (again.ran, again.skipped) == (0, 40)


class KillsItsActorOnce(OracleAgent):
    """The oracle, except that the 6th episode an actor starts kills that actor (``ray.kill``), once per test."""

    started = 0  # per actor process: every episode gets its own copy of the agent

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def reset(self, env, observation, info):
        type(self).started += 1
        if type(self).started == 6:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:  # another actor was the one
                pass
            else:
                import ray as ray_

                ray_.kill(ray_.get_runtime_context().current_actor)
                time.sleep(60)  # never reached: the kill ends this process
        super().reset(env, observation, info)


def test_an_actor_killed_mid_run_has_its_episodes_rerun_and_each_lands_once(tmp_path):
    import functools

    marker = tmp_path / "killed"
    out = tmp_path / "traj.jsonl"
    [summary] = run_jobs([_job(out, make=functools.partial(KillsItsActorOnce, str(marker)))], "ray",
                         ray=RaySection(num_actors=2, env_cpus=0.5, max_concurrent_per_actor=4))
    assert marker.exists(), "no actor was killed"
    assert summary.actor_deaths == 1
    records = _by_key(out)
    assert sorted(records) == [(TAU, s, 0) for s in range(40)]
    assert all(r["success"] for r in records.values())


class HangsOnce(OracleAgent):
    """The oracle, except that the first turn of the 3rd episode an actor starts blocks forever, once per test (an
    agent or env that hangs without killing its actor: the actor stays alive, its chunk hands nothing back)."""

    started = 0  # per actor process: every episode gets its own copy of the agent

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.hang = marker, False

    def reset(self, env, observation, info):
        type(self).started += 1
        self.hang = type(self).started == 3
        super().reset(env, observation, info)

    def __call__(self, observation, info):
        if self.hang:
            self.hang = False
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:  # another actor was the one
                pass
            else:
                threading.Event().wait()  # forever: only the liveness rule ends this
        return super().__call__(observation, info)


def test_a_chunk_that_hangs_on_a_live_actor_is_rerun_elsewhere(tmp_path):
    import functools

    marker = tmp_path / "hung"
    out = tmp_path / "traj.jsonl"
    [summary] = run_jobs([_job(out, make=functools.partial(HangsOnce, str(marker)), seeds=range(16))], "ray",
                         ray=RaySection(num_actors=2, env_cpus=0.5, max_concurrent_per_actor=4, stall_s=3))
    assert marker.exists(), "no episode hung"
    assert summary.actor_deaths == 1  # the hung chunk's actor, replaced
    records = _by_key(out)
    assert sorted(records) == [(TAU, s, 0) for s in range(16)]
    assert all(r["success"] for r in records.values())


def test_actors_that_no_node_can_place_fail_with_what_they_ask(tmp_path):
    out = tmp_path / "traj.jsonl"
    with pytest.raises(RayBackendError) as err:
        run_jobs([_job(out, seeds=range(4))], "ray",
                 ray=RaySection(num_actors=2, env_cpus=8, max_concurrent_per_actor=2, start_timeout_s=3))
    assert "no Ray actor started" in str(err.value) and "8 CPU" in str(err.value), err.value
    assert not read_trajectories(out) if out.exists() else True


CHILD = """
import sys, time
import ray
from pathlib import Path
from trace_envs import OracleAgent
from trace_train.backends import RolloutJob, run_jobs
from trace_train.pipeline.config import RaySection

class SlowOracle(OracleAgent):
    def __call__(self, observation, info):
        time.sleep(0.05)
        return super().__call__(observation, info)

ray.init(address=sys.argv[2], logging_level="WARNING")
job = RolloutJob(key="oracle", make=SlowOracle, targets=["trace/tau_airline-v0"], seeds=list(range(40)),
                 out=Path(sys.argv[1]), progress=False, agent_name="oracle")
run_jobs([job], "ray", ray=RaySection(num_actors=2, env_cpus=0.5, max_concurrent_per_actor=2))
"""


def test_an_interrupted_driver_resumes_with_every_episode_exactly_once(tmp_path, cluster):
    out = tmp_path / "traj.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(out), cluster], cwd=ROOT, env=os.environ.copy())
    deadline = time.time() + 120
    while (out.read_bytes().count(b"\n") if out.exists() else 0) < 5:
        assert proc.poll() is None, "the driver ended before it could be killed"
        assert time.time() < deadline, "the driver wrote nothing in 120 s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = len(read_trajectories(out))
    assert 5 <= before < 40, "the driver was not interrupted mid-way"
    [summary] = run_jobs([_job(out)], "ray", ray=RAY)
    assert (summary.skipped, summary.ran) == (before, 40 - before)
    records = _by_key(out)
    assert sorted(records) == [(TAU, s, 0) for s in range(40)]
    assert all(r["success"] for r in records.values())


def test_an_episode_that_fails_on_bad_env_input_is_an_env_error_not_a_retry_loop(tmp_path):
    out = tmp_path / "traj.jsonl"
    [summary] = run_jobs([_job(out, seeds=range(3), env_kwargs={TAU: {"no_such_option": 1}})], "ray", ray=RAY)
    records = _by_key(out)
    assert sorted(records) == [(TAU, s, 0) for s in range(3)] and summary.env_errors == 3
    for r in records.values():
        assert r["termination"] == "env_error" and "no_such_option" in r["env_error"], r["env_error"]


def test_trace_run_ray_plays_the_rollout_stage_on_actors_like_local(tmp_path, capsys):
    import json

    from trace_train.cli import main

    base = {"kind": "scripted", "agent": "tau:noisy", "agent_kwargs": {"p": 0.5}}
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"base: {json.dumps(base)}\nrollout: {{seeds: '1000:1012'}}\ntrain: {{model: /nonexistent}}\n"
                   "ray: {num_actors: 2, env_cpus: 0.5, max_concurrent_per_actor: 4}\n")
    runs = {}
    for name, extra in (("ray", ["--ray"]), ("local", [])):
        out = tmp_path / name
        assert main(["run", str(cfg), "--out", str(out), "--until", "rollout", "--no-progress", *extra]) == 0
        runs[name] = _by_key(out / "rollouts" / "trajectories.jsonl")
    assert sorted(runs["ray"]) == sorted(runs["local"]) and len(runs["ray"]) == 12
    assert all(runs["ray"][k]["messages"] == runs["local"][k]["messages"] for k in runs["ray"])
    # Where the episodes ran is not an input of the stage: the local run finds the Ray run's stage done.
    capsys.readouterr()
    assert main(["run", str(cfg), "--out", str(tmp_path / "ray"), "--until", "rollout", "--no-progress"]) == 0
    assert "rollout: done already" in capsys.readouterr().out


@pytest.mark.parametrize("section, needle", [
    ({"ray": {"address": "nonsense"}}, "'nonsense' is not a Ray cluster address"),
    ({"ray": {"num_actors": 0}}, "ray.num_actors must be >= 1, got 0"),
    ({"ray": {"env_cpus": -1}}, "ray.env_cpus must be >= 0"),
    ({"rollout": {"engine": "spark"}}, "rollout.engine: 'spark' is not one of local, ray"),
])
def test_bad_ray_config_values_fail_at_load_time(section, needle):
    with pytest.raises(ConfigError) as err:
        config_from_dict(section)
    assert needle in str(err.value)


def test_bad_ray_settings_fail_before_any_work(tmp_path):
    out = tmp_path / "traj.jsonl"
    with pytest.raises(ConfigError, match="ray.num_actors must be >= 1"):
        run_jobs([_job(out)], "ray", ray=RaySection(num_actors=0))
    assert not out.exists()
    cli = [sys.executable, "-m", "trace_train.cli", "rollout", "--env", TAU, "--seeds", "3", "--out", str(out),
           "--no-progress"]
    nobody = subprocess.run(cli + ["--ray", "127.0.0.1:1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert nobody.returncode == 2 and "ray.address '127.0.0.1:1': no Ray cluster answers there" in nobody.stderr, \
        nobody.stderr[-2000:]
    zero = subprocess.run(cli + ["--ray", "--ray-actors", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert zero.returncode == 2 and "--ray-actors must be >= 1, got 0" in zero.stderr, zero.stderr[-2000:]
    assert not out.exists()


def test_ray_is_imported_only_with_ray(tmp_path):
    script = f"""
import sys
import trace_envs
assert "ray" not in sys.modules, "import trace_envs imported ray"
from trace_train.cli import main
try:
    main(["rollout", "--help"])
except SystemExit:
    pass
assert main(["rollout", "--env", "{TAU}", "--seeds", "2", "--out", r"{tmp_path / 'o.jsonl'}", "--no-progress"]) == 0
assert main(["run", "--dry-run", "--out", r"{tmp_path / 'run'}"]) == 0
assert "ray" not in sys.modules, "a command without --ray imported ray"
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.docker
def test_an_swe_rollout_starts_its_containers_on_the_actors_and_leaves_none(tmp_path):
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no engine here
        pytest.skip(f"no Docker engine: {exc}")
    from trace_envs.swe.repos import RepoSpec, save_repo
    from trace_envs.swe.sandbox import LABEL

    save_repo(RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",)))

    def ours() -> list:
        return client.containers.list(all=True, filters={"label": LABEL})

    before = {c.id for c in ours()}
    seen: dict[str, str] = {}
    stop = threading.Event()

    def watch() -> None:  # who owns the containers that appear during the run
        while not stop.is_set():
            for c in ours():
                if c.id not in before:
                    seen[c.id] = c.labels.get("org.trace.pid", "")
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out = tmp_path / "swe.jsonl"
    job = RolloutJob(key="oracle", make=OracleAgent, targets=["trace/swe_repo-v0"], seeds=list(range(4)), out=out,
                     progress=False, env_kwargs={"trace/swe_repo-v0": {
                         "repos": ["minicalc"], "instances_dir": str(FIXTURE / "minicalc_instances")}})
    try:
        [summary] = run_jobs([job], "ray", ray=RaySection(num_actors=2, env_cpus=0.5, max_concurrent_per_actor=2,
                                                          max_container_starts=1))
    finally:
        stop.set()
        watcher.join()
    records = _by_key(out)
    assert sorted(records) == [("trace/swe_repo-v0", s, 0) for s in range(4)]
    assert summary.env_errors == 0 and all(r["reward"] == 1.0 for r in records.values()), \
        [(r["termination"], r.get("env_error")) for r in records.values()]
    assert seen and str(os.getpid()) not in seen.values(), seen  # started by the actors, not by this process
    assert {c.id for c in ours()} - before == set(), "containers were left behind"
