"""Image builds fail like infrastructure, and are handled as such (trace_envs.swe.images).

* a half-made root filesystem that a failed debootstrap left with ``/proc`` mounted inside is unmounted and
  removed before the next try (``rmtree(ignore_errors=True)`` left it there, silently, and every later build
  started dirty and failed);
* a failed build raises :class:`ImageBuildError` with its log once, and the same error at once afterwards in
  the process, instead of a 40-second debootstrap on every tool call;
* two builders of one image on one machine run one after the other, and the second finds the image built;
* an SWE episode whose image cannot be built ends with termination ``env_error``, never as the agent's
  failure, and a rollout on a machine that cannot build the base image stops before its first episode.

Needs a Docker engine (scripts/setup_docker.sh) and root (mounting a tmpfs), as `make test` has.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.swe import images
from trace_envs.swe.images import ImageBuildError

FIXTURE = Path(__file__).parent / "fixtures"


@pytest.fixture
def scratch_base(tmp_path, monkeypatch):
    """A base image tag nobody has built, a cache of its own, and a Debian mirror that refuses connections."""
    monkeypatch.setenv("TRACE_SWE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(images, "base_image_tag", lambda: f"trace-swe-base:test-{tmp_path.name[-8:]}")
    monkeypatch.setattr(images, "_debian_mirror", lambda: "http://127.0.0.1:9/debian")
    monkeypatch.setattr(images, "_FAILED_BUILDS", {})
    return tmp_path / "cache"


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_a_partial_rootfs_with_proc_mounted_is_unmounted_and_removed(tmp_path):
    partial = tmp_path / "rootfs-bookworm.partial"
    (partial / "proc").mkdir(parents=True)
    (partial / "etc").mkdir()
    (partial / "etc" / "hostname").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(partial / "proc")], check=True)
    (partial / "proc" / "inside").write_text("held by the mount")
    assert _mounted(partial / "proc")
    images.remove_partial_tree(partial)
    assert not partial.exists() and not _mounted(partial / "proc")
    images.remove_partial_tree(partial)  # nothing there: nothing to do


def test_a_failed_base_build_is_reported_once_with_its_log(scratch_base, monkeypatch):
    runs = []
    real_run = subprocess.run

    def counting_run(cmd, *a, **kw):
        runs.append(cmd[0])
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(images.subprocess, "run", counting_run)
    with pytest.raises(ImageBuildError) as first:
        images.build_base_image(verbose=False)
    assert "debootstrap failed" in str(first.value) and first.value.log.is_file()
    assert "127.0.0.1:9" in first.value.log.read_text()  # the log says what was tried
    assert not (scratch_base / "rootfs-bookworm.partial").exists()  # the next try starts clean
    assert runs.count("debootstrap") == 1
    t0 = time.monotonic()
    with pytest.raises(ImageBuildError) as again:
        images.build_base_image(verbose=False)
    assert again.value is first.value and time.monotonic() - t0 < 2 and runs.count("debootstrap") == 1
    with pytest.raises(ImageBuildError):
        images.build_base_image(force=True, verbose=False)  # force tries again
    assert runs.count("debootstrap") == 2


def test_two_builders_of_one_image_build_it_once(scratch_base, monkeypatch):
    built, started = [], threading.Event()

    def slow_build(client, tag, from_registry, say):
        started.set()
        time.sleep(0.5)
        built.append(tag)

    monkeypatch.setattr(images, "_build_base_locked", slow_build)
    monkeypatch.setattr(images, "image_exists", lambda client, tag: bool(built))
    results = []
    threads = [threading.Thread(target=lambda: results.append(images.build_base_image(verbose=False)))
               for _ in range(2)]
    threads[0].start()
    started.wait(5)
    threads[1].start()
    for t in threads:
        t.join(10)
    assert len(built) == 1 and results == [images.base_image_tag()] * 2


def test_an_episode_whose_image_cannot_be_built_ends_with_env_error(scratch_base, monkeypatch):
    from trace_envs.swe.repos import RepoSpec, save_repo

    save_repo(RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",)))
    monkeypatch.setattr(images, "image_exists", lambda client, tag: False)
    env = gym.make("trace/swe_repo-v0", repos=["minicalc"], instances_dir=str(FIXTURE / "minicalc_instances"))
    try:
        for seed in (0, 1):
            env.reset(seed=seed)
            t0 = time.monotonic()
            obs, reward, terminated, truncated, info = env.step(hermes_tool_call("bash", {"command": "ls"}))
            assert terminated and reward == 0.0 and info["termination"] == "env_error", info.get("termination")
            assert "debootstrap failed" in info["env_error"] and "log:" in info["env_error"]
            assert info["reward_breakdown"] == {"reason": "env_error", "error": info["env_error"]}
            if seed == 1:  # remembered: the second episode does not build again
                assert time.monotonic() - t0 < 2
    finally:
        env.close()
    assert env.unwrapped.open_resources() == []


def test_a_rollout_on_a_machine_that_cannot_build_the_image_stops_before_its_first_episode(scratch_base, tmp_path):
    from trace_envs import OracleAgent
    from trace_envs.core import EnvError
    from trace_envs.swe.repos import RepoSpec, save_repo
    from trace_train.rollouts import run_rollouts

    save_repo(RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",)))
    out = tmp_path / "traj.jsonl"
    with pytest.raises(EnvError, match="cannot run on this machine: the sandbox cannot run here: debootstrap failed"):
        run_rollouts("trace/swe_repo-v0", OracleAgent(), range(3), out=out, progress=False,
                     env_kwargs={"repos": ["minicalc"], "instances_dir": str(FIXTURE / "minicalc_instances")})
    assert not out.exists() or out.read_text() == ""
