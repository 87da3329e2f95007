"""The SWE sandbox under hostile commands: each returns a clear observation within its budget, and the
environment stays usable for the next command and for grading.

One episode of ``trace/swe_repo-v0`` on the small fixture repository (tests/fixtures/minicalc) runs a
fork bomb, a background process that keeps the command's output open, a 2 GB allocation and a 3 GB
write, one after the other, checking after each that the next command works and that nothing the
command started is still running; then the oracle's fix is submitted and must still earn 1.0.
Needs a Docker engine (scripts/setup_docker.sh).
"""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs.core.conversation import hermes_tool_call

FIXTURE = Path(__file__).parent / "fixtures"
COMMAND_TIMEOUT = 20  # generous: a 2 GB allocation reaches the OOM kill slowly on a loaded machine


@pytest.fixture(scope="module")
def episode():
    from trace_envs.swe.repos import RepoSpec, save_repo

    save_repo(RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",)))
    env = gym.make("trace/swe_repo-v0", repos=["minicalc"], instances_dir=str(FIXTURE / "minicalc_instances"),
                   command_timeout=COMMAND_TIMEOUT)
    env.reset(seed=0)
    yield env
    env.close()
    assert env.unwrapped.open_resources() == []


def bash(env, command: str) -> tuple[str, float]:
    t0 = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(hermes_tool_call("bash", {"command": command}))
    assert not (terminated or truncated), obs  # never a sandbox error
    return obs, time.monotonic() - t0


def assert_usable(env) -> None:
    """The next command answers at once, and no process of the agent survived the previous one."""
    obs, seconds = bash(env, "echo ok; for p in /proc/[0-9]*; do [ -O $p ] && echo $p; done | wc -l")
    lines = obs.split("\n")
    assert "ok" in lines and seconds < 5, obs
    # this command's own processes only: the shell that runs it, the loop's subshells, wc
    assert int([x for x in lines if x.strip().isdigit()][-1]) <= 6, obs


def test_fork_bomb_is_stopped_and_cleaned_up(episode):
    obs, seconds = bash(episode, "bomb() { bomb | bomb & }; bomb; sleep 1")
    assert seconds < COMMAND_TIMEOUT + 15
    assert "process limit (256) was reached" in obs or "timed out" in obs, obs[-500:]
    assert_usable(episode)


def test_background_process_holding_stdout_neither_blocks_nor_survives(episode):
    obs, seconds = bash(episode, "(sleep 2; touch /tmp/still_running; sleep 60) & echo started")
    assert "started" in obs and "timed out" not in obs and seconds < 5, obs
    obs, _ = bash(episode, "sleep 3; ls /tmp/still_running 2>&1")
    assert "No such file" in obs, obs
    assert_usable(episode)


def test_2gb_allocation_is_reported_as_out_of_memory(episode):
    obs, seconds = bash(episode, "python3 -c \"b = bytearray(2 * 1024**3); b[::4096] = b'x' * (len(b) // 4096)\"")
    assert "killed: out of memory (limit 2048 MB)" in obs, obs[-500:]
    assert "timed out" not in obs and seconds < COMMAND_TIMEOUT + 15
    assert_usable(episode)


def test_3gb_write_stops_at_the_disk_budget(episode):
    obs, seconds = bash(episode, "dd if=/dev/zero of=/tmp/big bs=1M count=3072")
    assert "disk budget exhausted: /tmp is full (512 MB)" in obs and "No space left" in obs, obs[-500:]
    assert seconds < COMMAND_TIMEOUT + 15
    obs, _ = bash(episode, "rm /tmp/big; df -m /tmp | tail -1")
    assert "disk budget" not in obs, obs
    assert_usable(episode)


def test_timeout_is_reported_as_a_timeout(episode):
    obs, seconds = bash(episode, "sleep 60")
    assert f"timed out after {COMMAND_TIMEOUT}s" in obs and "out of memory" not in obs, obs
    assert seconds < COMMAND_TIMEOUT + 15
    assert_usable(episode)


def test_the_episode_is_still_gradable_afterwards(episode):
    """After every test above, in the same container: the oracle's fix still earns 1.0."""
    env = episode.unwrapped
    for path, old, new in env.gold_edits():
        obs, *_ = episode.step(hermes_tool_call("replace_in_file", {"path": path, "old": old, "new": new}))
        assert "Replaced" in obs, obs
    obs, reward, terminated, truncated, info = episode.step(hermes_tool_call("submit", {}))
    assert terminated and reward == 1.0, info.get("reward_breakdown")
