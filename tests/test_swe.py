"""SWE environments: mutations, validation in Docker, grading, sandbox safety, localization.

Needs a Docker engine (scripts/setup_docker.sh). Uses the small repository in
tests/fixtures/minicalc for speed, plus one shipped instance per default library.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs
from trace_envs import make_agent, rollout
from trace_envs.core.conversation import hermes_tool_call

FIXTURE = Path(__file__).parent / "fixtures"
MINICALC_KW = {"repos": ["minicalc"], "instances_dir": str(FIXTURE / "minicalc_instances")}


def _docker_ok() -> bool:
    from conftest import REQUIREMENT_CHECKS

    return REQUIREMENT_CHECKS["docker"]()[0]


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind():
    """After the session, no container with the sandbox label may remain."""
    yield
    if not _docker_ok():
        return
    from trace_envs.swe.sandbox import labelled_containers

    deadline = time.time() + 10
    left = labelled_containers(all_owners=False)
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = [c for c in labelled_containers(all_owners=False) if c.status != "removing"]
    assert not left, f"containers left behind: {[c.name for c in left]}"


@pytest.fixture(scope="session", autouse=True)
def sandbox_base_image():
    """The sandbox's base image, built when missing by the code behind `trace swe build-image` (content-hash
    tagged, so this is a no-op once built; a cold debootstrap build takes about 2 minutes)."""
    from trace_envs.swe.images import base_image_tag, build_base_image, docker_client, image_exists

    if not image_exists(docker_client(), base_image_tag()):
        t0 = time.time()
        print(f"\nbuilding the SWE sandbox base image {base_image_tag()} (first run on this machine)...")
        build_base_image(verbose=True)
        print(f"built in {time.time() - t0:.0f}s")
    return base_image_tag()


@pytest.fixture(scope="session")
def minicalc():
    from trace_envs.swe.repos import RepoSpec, materialize, save_repo

    spec = RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",))
    save_repo(spec)
    return materialize(spec)


# ------------------------------------------------------------------------------------------ no docker needed

def test_import_does_not_load_docker_or_libcst():
    import subprocess
    import sys

    code = "import sys, trace_envs, trace_envs.swe; print('docker' in sys.modules, 'libcst' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_every_family_mutates_and_is_deterministic(minicalc):
    from trace_envs.swe.mutations import FAMILIES, enumerate_sites, sample_mutations

    files = {p: minicalc.files[p] for p in minicalc.source_files}
    sites = [s for p, src in files.items() for s in enumerate_sites(p, src)]
    seen = {s.family for s in sites}
    assert seen >= set(FAMILIES) - {"break_chain"}, set(FAMILIES) - seen
    a = sample_mutations(files, 7, 25)
    b = sample_mutations(files, 7, 25)
    assert [m.patch for m in a] == [m.patch for m in b]
    assert [m.patch for m in a] != [m.patch for m in sample_mutations(files, 8, 25)]
    for m in a:
        compile(m.mutated, m.site.file, "exec")
        assert m.mutated != m.original


def test_patch_roundtrip(minicalc):
    from trace_envs.swe.mutations import sample_mutations
    from trace_envs.swe.tasks import apply_patch, replacements

    files = {p: minicalc.files[p] for p in minicalc.source_files}
    for m in sample_mutations(files, 1, 10):
        assert apply_patch(files, m.patch)[m.site.file] == m.mutated
        assert apply_patch({m.site.file: m.mutated}, m.patch, reverse=True)[m.site.file] == m.original
        text = m.mutated
        for old, new in replacements(m.mutated, m.original):
            assert text.count(old) == 1
            text = text.replace(old, new)
        assert text == m.original


def test_shipped_instances_have_swe_smith_fields():
    from trace_envs.swe.repos import DEFAULT_REPOS
    from trace_envs.swe.tasks import load_instances

    insts = load_instances(list(DEFAULT_REPOS), max_bugs=None)
    assert len({i["repo"] for i in insts}) >= 1
    for inst in insts:
        for key in ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "base_commit", "image_name",
                    "problem_statement"):
            assert inst[key], key
        # the issue never quotes the changed code
        changed = [l[1:].strip() for l in inst["patch"].splitlines()
                   if l[:1] in "+-" and not l.startswith(("+++", "---")) and len(l[1:].strip()) > 12]
        assert not any(c in inst["problem_statement"] for c in changed), inst["instance_id"]


def test_localization_rewards():
    kw = dict(MINICALC_KW)
    for seed in range(4):
        assert rollout("trace/swe_localization-v0", make_agent("oracle"), seed, env_kwargs=kw)["reward"] == 1.0
        assert rollout("trace/swe_localization-v0", make_agent("loc:wrong_function"), seed,
                       env_kwargs=kw)["reward"] == 0.5
    env = gym.make("trace/swe_localization-v0", **kw)
    env.reset(seed=0)
    target = env.unwrapped.target
    _, reward, terminated, _, info = env.step(hermes_tool_call("submit_location", {"file": "nope.py",
                                                                                   "function": target["function"]}))
    assert terminated and reward == 0.0
    env.close()


# ------------------------------------------------------------------------------------------ Docker

def test_sandbox_limits_and_timeouts(minicalc):
    from trace_envs.swe.sandbox import DockerSandbox

    with DockerSandbox(minicalc.image()) as box:
        assert box.run("id -u").output.strip() == "1000"
        r = box.run("sleep 10", timeout=1)
        assert r.timed_out and r.exit_code == 124
        r = box.run("yes", timeout=5, max_output=1000)
        assert r.truncated and len(r.output) < 1200
        net = box.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\"")
        assert net.exit_code != 0 and "unreachable" in net.output.lower()
        caps = box.run("grep CapEff /proc/self/status").output
        assert caps.split()[-1].strip("0") == ""
        assert box.run("echo still alive").output.strip() == "still alive"


def test_a_sandbox_whose_harness_file_comes_late_still_starts_clean(minicalc):
    """On a loaded machine the container's main process can create the harness's output file after the first
    command arrives; the sandbox waits for it instead of reading a failed copy as a full process table."""
    from trace_envs.swe.sandbox import DockerSandbox

    class SlowStart(DockerSandbox):
        def _run_container(self, image, main, *args, **kwargs):
            return super()._run_container(image, "sleep 1.5 && " + main, *args, **kwargs)

    with SlowStart(minicalc.image()) as box:
        listing = box.run("ls")
        assert listing.exit_code == 0 and not listing.notes and "tests" in listing.output.split()
        assert box.run("echo ok").output.strip() == "ok"


def test_validation_in_docker_for_real(minicalc):
    from trace_envs.swe.mutations import sample_mutations
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import validate_candidates

    files = {p: minicalc.files[p] for p in minicalc.source_files}
    muts = sample_mutations(files, 11, 4)
    with DockerSandbox(minicalc.image()) as box:
        insts, stats = validate_candidates(minicalc, box, muts, combine=1, seed=11)
    assert stats.candidates == 4 and stats.valid >= 2
    for inst in insts:
        assert inst["FAIL_TO_PASS"] and inst["PASS_TO_PASS"]
        assert not set(inst["FAIL_TO_PASS"]) & set(inst["PASS_TO_PASS"])
    assert any(len(i["mutations"]) == 2 for i in insts)


def test_missing_tests_count_as_failed(minicalc):
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import evaluate_in_sandbox, prepare_sandbox

    inst = {"FAIL_TO_PASS": ["tests/test_core.py::test_no_such_test"], "PASS_TO_PASS": ["tests/test_core.py::test_mean"]}
    with DockerSandbox(minicalc.image()) as box:
        prepare_sandbox(box, {})
        reward, info = evaluate_in_sandbox(box, minicalc, inst, skip_if_unchanged=False)
    assert reward == 0.0 and info["FAIL_TO_PASS"] == {"tests/test_core.py::test_no_such_test": "missing"}


AGENT_EXPECTATIONS = {"oracle": 1.0, "swe:wrong_function": 0.0, "swe:edit_tests": 0.0, "swe:delete_tests": 0.0}


MINICALC_SEEDS = (0, 1)


@pytest.mark.parametrize("seed", MINICALC_SEEDS)
def test_oracle_and_deficit_agents(seed):
    """Every reference agent through gym.make + rollout, on the fixture repository."""
    env = gym.make("trace/swe_repo-v0", **MINICALC_KW)
    try:
        for name, expected in AGENT_EXPECTATIONS.items():
            record = rollout(env, make_agent(name), seed)
            assert record["reward"] == expected, (name, record["reward_breakdown"])
            assert record["termination"] == "agent_stop"
            if name == "oracle":
                assert set(record["reward_breakdown"]["FAIL_TO_PASS"].values()) == {"passed"}
    finally:
        env.close()
    assert env.unwrapped.open_resources() == []


def _shipped_sample() -> list[tuple[str, str]]:
    """One shipped instance per library, chosen by a fixed seed; every other library's is a two-bug instance."""
    import random

    from trace_envs.swe.tasks import PACKAGED_INSTANCES, load_instance_file

    out = []
    for path in sorted(PACKAGED_INSTANCES.glob("*.jsonl")):
        insts = load_instance_file(path)
        rng = random.Random(path.stem)
        multi = [i for i in insts if len(i["mutations"]) > 1]
        pool = multi if (len(out) % 2 and multi) else [i for i in insts if len(i["mutations"]) == 1]
        out.append((path.stem, rng.choice(pool)["instance_id"]))
    return out


def test_shipped_sample_covers_every_library():
    from trace_envs.swe.repos import DEFAULT_REPOS

    assert {repo for repo, _ in _shipped_sample()} == set(DEFAULT_REPOS)


@pytest.mark.parametrize("repo_key,instance_id", _shipped_sample())
def test_shipped_instance_grading(repo_key, instance_id):
    """Gold 1.0; empty patch, deleted and edited failing tests 0.0 (the checks of `trace swe validate --shipped`)."""
    from trace_envs.swe.envs import load_repo
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import REFERENCE_CHECKS, check_instance, load_instances

    inst = next(i for i in load_instances([repo_key], max_bugs=None) if i["instance_id"] == instance_id)
    repo = load_repo(repo_key)
    with DockerSandbox(repo.image()) as box:
        assert check_instance(box, repo, inst) == REFERENCE_CHECKS


def test_shipped_instance_oracle_through_the_env():
    """One real library end to end through gym.make: the oracle fixes it, the planted cheat earns nothing."""
    env = gym.make("trace/swe_repo-v0", repos=["isodate-0.7.2"], pool_size=1)
    try:
        assert rollout(env, make_agent("oracle"), 0)["reward"] == 1.0
        assert rollout(env, make_agent("swe:delete_tests"), 0)["reward"] == 0.0
    finally:
        env.close()
    assert env.unwrapped.open_resources() == []


def test_killed_container_ends_episode_cleanly():
    env = gym.make("trace/swe_repo-v0", **MINICALC_KW)
    obs, info = env.reset(seed=0)
    env.step(hermes_tool_call("list_files", {}))
    env.unwrapped._box.kill()
    t0 = time.time()
    obs, reward, terminated, truncated, info = env.step(hermes_tool_call("bash", {"command": "ls"}))
    assert time.time() - t0 < 20
    assert "Error" in obs and "sandbox" in obs
    assert terminated and not truncated and reward == 0.0
    # the machine's failure, not the agent's: env_error with its reason
    assert info["termination"] == "env_error" and "sandbox" in info["env_error"]
    assert info["reward_breakdown"]["reason"] == "env_error"
    env.close()
    assert env.unwrapped.open_resources() == []


def test_unwritable_file_is_the_agents_error_not_a_sandbox_failure():
    env = gym.make("trace/swe_repo-v0", **MINICALC_KW)
    try:
        env.reset(seed=0)
        env.step(hermes_tool_call("bash", {"command": "chmod -R a-w minicalc"}))
        obs, reward, terminated, truncated, info = env.step(
            hermes_tool_call("create_file", {"path": "minicalc/new.py", "content": "x = 1\n"}))
        assert "could not write" in obs and not (terminated or truncated)
        obs, *_ = env.step(hermes_tool_call("bash", {"command": "echo works"}))
        assert "works" in obs
    finally:
        env.close()


def test_warm_pool_reset_and_close():
    env = gym.make("trace/swe_repo-v0", pool_size=1, **MINICALC_KW)
    env.reset(seed=0)
    env.unwrapped._pools[next(iter(env.unwrapped._pools))].wait_ready(30)
    t0 = time.perf_counter()
    env.reset(seed=1)
    warm = time.perf_counter() - t0
    u = env.unwrapped
    assert u._box is not None and warm < 5
    # The pool indexed the clean tree ahead of time; nothing of it may survive in the episode's repository.
    import hashlib

    for path in u._bugged:
        clean = u.repo.files[path].encode()
        sha = hashlib.sha1(b"blob %d\0" % len(clean) + clean).hexdigest()
        assert u._box.run(f"git cat-file -e {sha}").exit_code != 0, path
    assert u._box.run("git rev-list --all --count").output.strip() == "1"
    assert u._box.run("git status --porcelain").output.strip() == ""
    record = rollout(env, make_agent("oracle"), 1)
    assert record["reward"] == 1.0
    env.close()
    assert env.unwrapped.open_resources() == []


def test_local_sandbox(minicalc):
    with pytest.warns(RuntimeWarning):
        env = gym.make("trace/swe_repo-v0", sandbox="local", **MINICALC_KW).unwrapped
        record = rollout(env, make_agent("oracle"), 0)
    assert record["reward"] == 1.0
    env.close()


def test_read_tools_agree_between_the_sandbox_and_memory(minicalc):
    """swe_localization serves the tree from memory with the target's read tools: same schemas, same output
    as swe_repo reading it in its sandboxes, Docker and local (the tests/ files, which no bug touches), same
    errors for bad paths."""
    from trace_envs.capabilities.swe_localization import SweLocalizationEnv
    from trace_envs.core import ToolError
    from trace_envs.core.tools import tool_specs
    from trace_envs.swe.envs import SweRepoEnv

    read = ("list_files", "view_file", "search")
    assert [tool_specs(SweRepoEnv)[n].openai_schema for n in read] == \
           [tool_specs(SweLocalizationEnv)[n].openai_schema for n in read]
    with warnings.catch_warnings():  # the local sandbox's "no isolation" warning (test_local_sandbox checks it)
        warnings.simplefilter("ignore", RuntimeWarning)
        local = gym.make("trace/swe_repo-v0", sandbox="local", **MINICALC_KW).unwrapped
        local.reset(seed=0)
        docker = gym.make("trace/swe_repo-v0", **MINICALC_KW).unwrapped
        docker.reset(seed=0)
        memory = gym.make("trace/swe_localization-v0", **MINICALC_KW).unwrapped
        memory.reset(seed=0)
        try:
            calls = [("list_files", {"path": "tests"}), ("list_files", {"path": "."}),
                     ("view_file", {"path": "tests/test_core.py"}),
                     ("view_file", {"path": "/testbed/tests/test_shapes.py", "start_line": 3, "end_line": 6}),
                     ("view_file", {"path": "tests/test_core.py", "start_line": 999}),
                     ("search", {"pattern": "def test_[a-z]+", "path": "tests"}),
                     ("search", {"pattern": "no_such_name_anywhere", "path": "tests"})]
            for name, args in calls:
                got = getattr(memory, name)(**args)
                assert got.strip(), (name, args)
                for repo in (local, docker):
                    assert getattr(repo, name)(**args) == got, (repo.sandbox_kind, name, args)
            assert "test_core.py:" in memory.search("def test_", "tests")
            assert memory.search("no_such_name_anywhere", "tests") == "(no matches)"
            for env in (local, docker, memory):
                with pytest.raises(ToolError, match="outside the repository"):
                    env.view_file("../etc/passwd")
                with pytest.raises(ToolError, match="invalid regular expression"):
                    env.search("def (", "tests")
                with pytest.raises(ToolError, match="no such directory: nope"):
                    env.list_files("nope")
                with pytest.raises(ToolError):
                    env.view_file("tests/nope.py")
        finally:  # no container left behind if an assertion fails
            for env in (local, docker, memory):
                env.close()


def test_cli_cleanup_removes_containers_of_dead_owners(minicalc):
    """`trace swe cleanup --only-dead` removes what a SIGKILLed process left, and spares live owners' containers
    (a plain `trace swe cleanup` would also remove those of other running processes, so tests never run it)."""
    import subprocess
    import sys

    from trace_envs.swe.sandbox import DockerSandbox, labelled_containers
    from trace_train.cli import main

    child = ("import os, signal, sys; from trace_envs.swe.sandbox import DockerSandbox; "
             "box = DockerSandbox(sys.argv[1]); print(box.container_id, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", child, minicalc.image()], capture_output=True, text=True, timeout=60)
    orphan = proc.stdout.split()[0]
    assert any(c.id == orphan for c in labelled_containers()), "SIGKILL leaves the container (nothing can run)"
    with DockerSandbox(minicalc.image()) as mine:
        assert main(["swe", "cleanup", "--only-dead"]) in (0, None)
        left = {c.id for c in labelled_containers() if c.status != "removing"}
        assert orphan not in left and mine.container_id in left
        assert mine.run("echo alive").output.strip() == "alive"


def test_cleanup_never_touches_containers_trace_did_not_start(minicalc):
    """A container someone else runs from a TRACE image inherits the image's labels, never the run label
    (set only at `docker run`); not even an image that carries the run label itself passes for ours."""
    import io
    import uuid

    from trace_envs.swe.images import docker_client
    from trace_envs.swe.sandbox import RUN_LABEL, labelled_containers
    from trace_train.cli import main

    client = docker_client()
    tag = f"trace-test-forged-run-label:{uuid.uuid4().hex[:8]}"
    client.images.build(fileobj=io.BytesIO(f"FROM {minicalc.image()}\nLABEL {RUN_LABEL}=1:1\n".encode()), tag=tag,
                        rm=True)
    foreign = [client.containers.run(image, ["sleep", "120"], detach=True, labels={"org.trace.test": "foreign"})
               for image in (minicalc.image(), tag)]
    try:
        assert main(["swe", "cleanup", "--only-dead"]) in (0, None)
        ours = {c.id for c in labelled_containers()}
        for container in foreign:
            container.reload()
            assert container.status == "running" and container.id not in ours
    finally:
        for container in foreign:
            container.remove(force=True)
        client.images.remove(tag, force=True)


_SIGNAL_CHILD = """
import os, signal, sys, time
import gymnasium as gym
import trace_envs
from trace_envs.core.conversation import hermes_tool_call
if sys.argv[1] == "host-handler":  # a host program's own handler must still run after the cleanup
    def host(signum, frame):
        print("host handler ran", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, host)
env = gym.make("trace/swe_repo-v0", repos=["minicalc"], instances_dir=sys.argv[2])
env.reset(seed=0)
env.step(hermes_tool_call("bash", {"command": "true"}))  # the container is running now
print("ready", env.unwrapped._box.container_id, flush=True)
env.step(hermes_tool_call("bash", {"command": "sleep 60"}))  # killed in the middle of this command
print("not reached", flush=True)
"""


@pytest.mark.parametrize("mode", ["default", "host-handler"])
def test_sigterm_mid_episode_leaves_no_container(minicalc, mode):
    import signal
    import subprocess
    import sys

    from trace_envs.swe.sandbox import labelled_containers

    proc = subprocess.Popen([sys.executable, "-c", _SIGNAL_CHILD, mode, MINICALC_KW["instances_dir"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), line + proc.stderr.read()
        container_id = line.split()[1]
        time.sleep(0.5)  # inside `sleep 60` now
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    if mode == "default":
        assert proc.returncode == -signal.SIGTERM, err  # died of the signal, as without TRACE's handler
    else:
        assert proc.returncode == 3 and "host handler ran" in out, err
    assert "not reached" not in out
    mine = [c for c in labelled_containers() if c.labels.get("org.trace.pid") == str(proc.pid)]
    assert not [c for c in mine if c.status != "removing"], [c.id[:12] for c in mine]
    assert all(c.id != container_id or c.status == "removing" for c in labelled_containers())


def test_cli_add_repo_from_local_git_repository(tmp_path, monkeypatch, capsys):
    """`trace swe add-repo git:PATH` end to end: fetch at a revision, detect tests, build the image, run the suite."""
    import shutil

    import git

    from trace_envs.swe.repos import known_repos
    from trace_train.cli import main

    monkeypatch.setenv("TRACE_SWE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "calc"
    shutil.copytree(FIXTURE / "minicalc", src, ignore=shutil.ignore_patterns("__pycache__"))
    repo = git.Repo.init(src)
    repo.index.add([p.relative_to(src).as_posix() for p in src.rglob("*.py")])
    actor = git.Actor("t", "t@localhost")
    first = repo.index.commit("minicalc", author=actor, committer=actor).hexsha
    (src / "UNCOMMITTED.py").write_text("raise SystemExit('must not be fetched')\n")
    assert main(["swe", "add-repo", f"git:{src}@{first}", "--key", "calc-git"]) in (0, None)
    out = capsys.readouterr().out
    assert "tests ['tests']" in out and "0 failed/error" in out and "added calc-git" in out
    spec = known_repos()["calc-git"]
    assert spec.source == f"git:{src}@{first}"
    assert not (tmp_path / "cache" / "repos" / "calc-git" / "UNCOMMITTED.py").exists()
