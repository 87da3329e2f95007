"""The dynamic admission checks, run in a separate, sandboxed process (see :mod:`generators.admit`).

``python admission_worker.py`` reads one JSON job from stdin, imports the candidate module, registers
it with Gymnasium under its id and runs the checks one after the other, printing one line per event
(``<nonce> {"event": "start"|"result"|"digest", ...}``) as it goes, so the parent knows which check
was running when a timeout or the memory limit hit. The nonce (from the job) keeps a module's own
prints from passing for results.

In ``digest`` mode it only computes the task digests of a few seeds; the parent runs such a process
beside the full one (with another ``PYTHONHASHSEED``) and compares the two, which catches tasks that
depend on the process (``hash()`` of strings, set order, the clock).

This file imports only the standard library at module level: the candidate and ``trace_envs`` are
imported once the job is read, inside the sandbox.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import traceback

_NONCE = ""
_OUT = sys.stdout


def emit(**event) -> None:
    _OUT.write(f"{_NONCE} {json.dumps(event, default=str)}\n")
    _OUT.flush()


class CheckFailed(Exception):
    """A check's verdict (the message is the reason, with its figure)."""

    def __init__(self, reason: str, figure: str = ""):
        super().__init__(reason)
        self.figure = figure


def run_check(name: str, fn, *args) -> bool:
    emit(event="start", check=name)
    t0 = time.perf_counter()
    try:
        figure = fn(*args) or ""
        emit(event="result", check=name, passed=True, figure=figure, reason="", seconds=time.perf_counter() - t0)
        return True
    except CheckFailed as exc:
        emit(event="result", check=name, passed=False, figure=exc.figure, reason=str(exc),
             seconds=time.perf_counter() - t0)
    except MemoryError:
        emit(event="result", check=name, passed=False, figure="", seconds=time.perf_counter() - t0,
             reason="exceeded the memory limit (MemoryError)")
    except BaseException as exc:  # the candidate's own failure (SystemExit included), reported with its traceback
        emit(event="result", check=name, passed=False, figure="", seconds=time.perf_counter() - t0,
             reason=f"raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-6)}")
    return False


# ------------------------------------------------------------------------------------------------ episodes
def episode(env, agent, seed: int) -> dict:
    """One episode with every step's reward checked; an exception out of ``step`` is a failure."""
    obs, info = env.reset(seed=seed)
    if hasattr(agent, "reset"):
        agent.reset(env.unwrapped, obs, info)
    limit = env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 200
    rewards = []
    for step in range(limit + 1):
        action = agent(obs, info)
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except Exception as exc:
            raise CheckFailed(f"step raised {type(exc).__name__}: {exc} (seed {seed}, step {step}, agent "
                              f"{getattr(agent, 'name', '?')})\n{traceback.format_exc(limit=-6)}") from None
        reward = float(reward)
        if not 0.0 <= reward <= 1.0:
            raise CheckFailed(f"reward {reward} outside [0, 1] (seed {seed}, step {step}, agent "
                              f"{getattr(agent, 'name', '?')})", figure=str(reward))
        rewards.append(reward)
        if terminated or truncated:
            break
    return {"reward": sum(rewards), "success": bool(info.get("success")), "steps": len(rewards),
            "step_rewards": rewards}


def digest(env, seed: int) -> str:
    from trace_envs.agents import OracleAgent

    obs, info = env.reset(seed=seed)
    parts = [obs, env.unwrapped.task_fingerprint(), json.dumps(info.get("tools", []), sort_keys=True)]
    agent = OracleAgent()
    agent.reset(env.unwrapped, obs, info)
    for _ in range(env.spec.max_episode_steps or 50):
        obs, reward, terminated, truncated, info = env.step(agent(obs, info))
        if terminated or truncated:
            break
    parts.append(json.dumps(info.get("messages", []), sort_keys=True, default=str))
    return hashlib.sha256("\x1e".join(parts).encode("utf-8")).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ checks
def check_import(job: dict) -> str:
    import importlib

    sys.path.insert(0, job["module_dir"])
    module = importlib.import_module(job["module_name"])
    cls = getattr(module, job["class"], None)
    from trace_envs.core.env import TraceEnv

    if not (isinstance(cls, type) and issubclass(cls, TraceEnv)):
        raise CheckFailed(f"{job['class']} is not a subclass of trace_envs.TraceEnv")
    import gymnasium as gym

    gym.register(id=job["env_id"], entry_point=f"{job['module_name']}:{job['class']}",
                 max_episode_steps=job["max_episode_steps"], kwargs=dict(job.get("kwargs") or {}))
    return ""


def check_schemas(job: dict, result: dict) -> str:
    import gymnasium as gym

    env = gym.make(job["env_id"])
    try:
        names, tools = set(), {}
        for seed in range(3):  # tools may depend on the task; look at a few
            _, info = env.reset(seed=seed)
            for t in info.get("tools", []):
                tools.setdefault(t["function"]["name"], t)
                names.add(t["function"]["name"])
    finally:
        env.close()
    target = {t["function"]["name"]: t for t in job["target_schemas"]}
    answer = set(job.get("answer_tools") or [])
    changed = sorted(n for n in names if n in target and tools[n] != target[n])
    extra = sorted(n for n in names if n not in target and n not in answer)
    answer_clash = sorted(answer & set(target))
    result["changed"], result["extra"] = changed, extra
    if answer_clash:
        raise CheckFailed(f"answer tools {answer_clash} are target tools; only new submit_* tools may be declared")
    return f"{len(names)} tools, {len(names & set(target))} of the target's"


def check_identical(job: dict, result: dict) -> str:
    if result.get("changed"):
        raise CheckFailed(f"changes the schema of the target tool(s) {result['changed']} "
                          f"(a tool must keep the target's name, description and parameters exactly)")
    return "every shared tool identical"


def check_no_extra(job: dict, result: dict) -> str:
    if result.get("extra"):
        raise CheckFailed(f"adds tool(s) {result['extra']} that the target lacks "
                          f"(declare a final-answer tool as REGISTRATION['answer_tools'] = ['submit_...'])")
    return "none"


def check_conformance_one(job: dict, name: str) -> str:
    from trace_envs.core.checker import check_trace_env

    report = check_trace_env(job["env_id"], n_seeds=job["n_seeds"], only=[name])
    res = report.results[0]
    if not res.ok:
        raise CheckFailed(res.detail.strip())
    return res.detail


def check_probe(job: dict, agent, bound: float, seeds: list[int], record: list) -> str:
    import gymnasium as gym

    from generators.probes import PROBE_SUCCESS_BOUND

    env = gym.make(job["env_id"])
    try:
        eps = [episode(env, agent, s) for s in seeds]
    finally:
        env.close()
    rewards = [e["reward"] for e in eps]
    record.extend(rewards)
    mean = sum(rewards) / len(rewards)
    success = sum(e["success"] for e in eps) / len(eps)
    success_bound = min(bound, PROBE_SUCCESS_BOUND)
    figure = f"mean {mean:.3f} (bound {bound}), success {success:.2f} (bound {success_bound})"
    if mean > bound or success > success_bound:
        raise CheckFailed(f"{agent.name} earns mean reward {mean:.3f} (bound {bound}) and succeeds on {success:.0%} "
                          f"of {len(seeds)} seeds: the reward pays for behaviour that does not use the capability",
                          figure=figure)
    return figure


def check_calibration(job: dict, record: list) -> str:
    import gymnasium as gym

    from trace_envs.calibration import Group, summarize_groups
    from generators.probes import MixtureAgent

    cal = job["calibration"]
    env = gym.make(job["env_id"])
    groups = []
    try:
        if cal.get("agent"):
            from trace_envs.calibration import make_seeded_agent

            members = [make_seeded_agent(cal["agent"], j) for j in range(cal["group_size"])]
        else:
            members = [MixtureAgent(job["capability"], deficit=cal["deficit"], random=cal["random"], seed=j)
                       for j in range(cal["group_size"])]
        for g in range(cal["groups"]):
            seed = cal["seed_offset"] + g
            eps = [episode(env, m, seed) for m in members]
            record.extend(e["reward"] for e in eps)
            groups.append(Group(seed, [e["reward"] for e in eps], [e["success"] for e in eps]))
    finally:
        env.close()
    name = getattr(members[0], "name", type(members[0]).__name__)
    report = summarize_groups(groups, env_id=job["env_id"], agent=name)
    figure = (f"mean {report.mean_reward:.2f}, success {report.success_rate:.2f}, all-0 {report.all_zero:.0%}, "
              f"all-1 {report.all_one:.0%}, informative {report.informative:.0%} "
              f"({cal['groups']}x{cal['group_size']}, {name})")
    out = [f"{name} {value:.2f} outside [{lo}, {hi}]" for name, value, lo, hi, ok in report.checks() if not ok]
    if out:
        raise CheckFailed("calibration outside the band (FACTS.md §1): " + "; ".join(out) + " — the env is too "
                          "easy or too hard for an agent lacking the capability", figure=figure)
    return figure


def main() -> int:
    global _NONCE
    job = json.loads(sys.stdin.read())
    _NONCE = job["nonce"]
    if not run_check("import", check_import, job):
        return 1
    if job.get("mode") == "digest":
        import gymnasium as gym

        env = gym.make(job["env_id"])
        try:
            digests = [digest(env, s) for s in job["digest_seeds"]]
        except BaseException as exc:
            emit(event="digest", digests=None, error=f"{type(exc).__name__}: {exc}")
            return 1
        emit(event="digest", digests=digests)
        return 0
    import gymnasium as gym

    def own_digests() -> str:
        env = gym.make(job["env_id"])
        try:
            emit(event="digest", digests=[digest(env, s) for s in job["digest_seeds"]])
        finally:
            env.close()
        return ""

    shared: dict = {}
    rewards: list[float] = []
    run_check("tool schemas", check_schemas, job, shared)
    run_check("tool schemas identical to the target's", check_identical, job, shared)
    run_check("no tool the target lacks", check_no_extra, job, shared)
    from trace_envs.core.checker import CHECKS

    for name, _ in CHECKS:
        run_check(f"conformance: {name}", check_conformance_one, job, name)
    run_check("task digests (this process)", own_digests)
    from generators.probes import PROBE_BOUND, probe_agents

    for agent in probe_agents(job["probe_seeds"][0]):
        run_check(f"probe: {agent.name.split(':', 1)[1]}", check_probe, job, agent,
                  float(job.get("probe_bound", PROBE_BOUND)), job["probe_seeds"], rewards)
    run_check("calibration", check_calibration, job, rewards)
    emit(event="rewards", count=len(rewards), low=min(rewards, default=0.0), high=max(rewards, default=0.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
