"""Calibration of an environment against an agent: GRPO-group statistics and pass@k.

GRPO learns only from groups whose rewards differ: every rollout of a group starts from the
same seed (the same task), and a group whose K rewards are all equal carries no signal. To set
an environment's default difficulty one runs G groups of K rollouts of a reference or base
agent and looks at (docs/design.md, "The method's settings", the authors' calibration criteria):

* the mean reward and the success rate — useful between 0.2 and 0.6 for the base model;
* the share of **all-0** groups (every reward 0; at most 20 %), of **all-1** groups (every
  reward 1; at most 20 %), and of **informative** groups (rewards not all equal; at least 50 %).
  A group that is constant at some other value (e.g. all 0.5) is neither all-0 nor all-1 and
  not informative either; it is counted as ``flat``;
* pass@1, pass@k (at least one of k samples succeeds; the unbiased estimator
  ``1 - C(n-c, k) / C(n, k)``) and τ²-bench's pass^k (all of k succeed,
  :func:`trace_envs.domains.evaluation.pass_hat_k`), with n = the group size and c its successes.

Group ``g`` uses the env seed ``seed_offset + g``; member ``j`` of every group gets the agent
sampling seed ``agent_seed + j`` (stochastic agents such as ``tau:noisy`` combine it with the env
seed, so members differ within a group and the same member differs across groups).

:func:`run_calibration` runs scripted (in-process) agents one episode at a time;
:func:`summarize` turns any list of trajectory records (``seed``, ``reward``, ``success``) into a
:class:`CalibrationReport`, so model-backed agents run through ``trace_train.rollouts`` can be
calibrated the same way (``trace envs calibrate`` does this).

This module imports only the standard library, numpy and gymnasium.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from math import comb
from typing import Any, Callable, Iterable, Sequence

#: (criterion, lower bound, upper bound) — docs/design.md, "The method's settings", for the base model.
CRITERIA = (
    ("mean_reward", 0.2, 0.6),
    ("success_rate", 0.2, 0.6),
    ("all_one", 0.0, 0.2),
    ("all_zero", 0.0, 0.2),
    ("informative", 0.5, 1.0),
)
_EPS = 1e-9


def pass_at_k(successes: int, trials: int, k: int) -> float:
    """The unbiased pass@k of one task: the chance that at least one of ``k`` of the ``trials`` samples succeeds."""
    if trials < k:
        raise ValueError(f"pass@{k} needs at least {k} trials per task, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be within 0..trials, got {successes}/{trials}")
    return 1.0 - comb(trials - successes, k) / comb(trials, k)


@dataclass
class Group:
    """The K rollouts of one env seed."""

    seed: int
    rewards: list[float]
    successes: list[bool]
    #: For a decision env (act or refuse, e.g. precondition_verification): the seed's gold decision.
    decision: str | None = None

    @property
    def kind(self) -> str:
        """``all_zero``, ``all_one``, ``flat`` (constant at another value) or ``informative``."""
        lo, hi = min(self.rewards), max(self.rewards)
        if hi - lo > _EPS:
            return "informative"
        if hi <= _EPS:
            return "all_zero"
        if lo >= 1.0 - _EPS:
            return "all_one"
        return "flat"


@dataclass
class CalibrationReport:
    """The statistics of G groups of K rollouts (see the module docstring).

    Shares (``all_zero``, ``all_one``, ``flat``, ``informative``) are fractions of the groups and sum to 1.
    ``pass_at`` and ``pass_hat`` map k (1..K) to pass@k and pass^k.
    """

    env_id: str
    agent: str
    groups: int
    group_size: int
    difficulty: int | None
    seed_offset: int
    mean_reward: float
    reward_std: float
    success_rate: float
    all_zero: float
    all_one: float
    flat: float
    informative: float
    pass_at: dict[int, float]
    pass_hat: dict[int, float]
    per_group: list[Group] = field(default_factory=list, repr=False)
    seconds: float = 0.0
    #: For a decision env: success on allowed and on must-refuse requests, and their mean (:func:`decision_accuracy`).
    decisions: dict | None = None

    @property
    def pass_at_1(self) -> float:
        return self.pass_at[1]

    def checks(self) -> list[tuple[str, float, float, float, bool]]:
        """(criterion, value, low, high, inside) for each of :data:`CRITERIA`."""
        return [(name, getattr(self, name), lo, hi, lo - _EPS <= getattr(self, name) <= hi + _EPS)
                for name, lo, hi in CRITERIA]

    @property
    def in_band(self) -> bool:
        """Whether every criterion of :data:`CRITERIA` holds (meaningful for a base model, not a scripted agent)."""
        return all(ok for *_, ok in self.checks())

    def to_dict(self, groups: bool = True) -> dict:
        d = asdict(self)
        d["pass_at"] = {str(k): v for k, v in self.pass_at.items()}
        d["pass_hat"] = {str(k): v for k, v in self.pass_hat.items()}
        d["checks"] = [{"criterion": n, "value": v, "low": lo, "high": hi, "ok": ok}
                       for n, v, lo, hi, ok in self.checks()]
        d["in_band"] = self.in_band
        if groups:
            d["per_group"] = [{**asdict(g), "kind": g.kind} for g in self.per_group]
        else:
            d.pop("per_group")
        return d

    def format(self) -> str:
        """A human-readable table of the report."""
        k = self.group_size
        title = (f"{self.env_id}  agent={self.agent}  groups={self.groups}x{k}"
                 + (f"  difficulty={self.difficulty}" if self.difficulty is not None else "")
                 + f"  seeds={self.seed_offset}..{self.seed_offset + self.groups - 1}")
        rows = [("mean reward", f"{self.mean_reward:.3f} (std {self.reward_std:.3f})", "0.2-0.6"),
                ("success rate", f"{self.success_rate:.3f}", "0.2-0.6"),
                ("all-0 groups", f"{self.all_zero:.1%}", "<= 20%"),
                ("all-1 groups", f"{self.all_one:.1%}", "<= 20%"),
                ("flat groups (other)", f"{self.flat:.1%}", ""),
                ("informative groups", f"{self.informative:.1%}", ">= 50%"),
                ("pass@1", f"{self.pass_at[1]:.3f}", "")]
        if k > 1:
            rows += [(f"pass@{k}", f"{self.pass_at[k]:.3f}", ""), (f"pass^{k}", f"{self.pass_hat[k]:.3f}", "")]
        if self.decisions:
            d = self.decisions
            rows += [("success: allowed", f"{d['allowed']['success']:.3f} (n={d['allowed']['n']})", ""),
                     ("success: must refuse", f"{d['must_refuse']['success']:.3f} (n={d['must_refuse']['n']})", ""),
                     ("balanced accuracy", f"{d['balanced_accuracy']:.3f}", "")]
        ok = {n: good for n, _, _, _, good in self.checks()}
        marks = {"mean reward": ok["mean_reward"], "success rate": ok["success_rate"], "all-0 groups": ok["all_zero"],
                 "all-1 groups": ok["all_one"], "informative groups": ok["informative"]}
        width = max(len(r[0]) for r in rows)
        vwidth = max(len(r[1]) for r in rows)
        lines = [title, "-" * len(title)]
        for name, value, target in rows:
            mark = "" if name not in marks else ("  ok" if marks[name] else "  OUT")
            lines.append(f"{name.ljust(width)}  {value.ljust(vwidth)}  {target.ljust(7)}{mark}".rstrip())
        lines.append(f"calibration band (docs/design.md, for a base model): {'inside' if self.in_band else 'outside'}")
        return "\n".join(lines)


def record_decision(record: dict) -> str | None:
    """The gold decision of a trajectory record's task (``act``/``refuse``), when its env is a decision env."""
    task = record.get("task") if isinstance(record.get("task"), dict) else {}
    decision = task.get("decision") or (record.get("reward_breakdown") or {}).get("decision")
    return decision if decision in ("act", "refuse") else None


def decision_accuracy(records: Iterable[dict]) -> dict | None:
    """Success on allowed (``act``) and on must-refuse requests apart, and their mean (balanced accuracy).

    A decision env balances the two, so a policy that always takes one decision scores 0.5 balanced
    accuracy at best whatever the mix, and learning the decision shows apart from learning the prior.
    ``records``: trajectory records, or dicts with ``decision`` and ``success``. None when no record has a decision.
    """
    counts = {"act": [0, 0], "refuse": [0, 0]}
    for r in records:
        decision = r["decision"] if "decision" in r else record_decision(r)
        if decision in counts:
            counts[decision][0] += 1
            counts[decision][1] += int(bool(r.get("success")))
    if not any(n for n, _ in counts.values()):
        return None
    rate = {k: (ok / n if n else 0.0) for k, (n, ok) in counts.items()}
    present = [rate[k] for k, (n, _) in counts.items() if n]
    return {"allowed": {"n": counts["act"][0], "success": rate["act"]},
            "must_refuse": {"n": counts["refuse"][0], "success": rate["refuse"]},
            "balanced_accuracy": sum(present) / len(present)}


def summarize_groups(groups: Sequence[Group], *, env_id: str = "", agent: str = "", difficulty: int | None = None,
                     seed_offset: int = 0, seconds: float = 0.0) -> CalibrationReport:
    """A :class:`CalibrationReport` from groups of equal size."""
    from .domains.evaluation import pass_hat_k

    if not groups:
        raise ValueError("calibration needs at least one group")
    sizes = {len(g.rewards) for g in groups}
    if len(sizes) != 1 or any(len(g.successes) != len(g.rewards) for g in groups):
        raise ValueError(f"every group must have the same number of rewards and successes, got sizes {sorted(sizes)}")
    k = sizes.pop()
    if k < 1:
        raise ValueError("groups must not be empty")
    rewards = [r for g in groups for r in g.rewards]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    kinds = [g.kind for g in groups]
    share = {name: kinds.count(name) / len(groups) for name in ("all_zero", "all_one", "flat", "informative")}
    counts = [(sum(bool(s) for s in g.successes), k) for g in groups]
    report = CalibrationReport(
        env_id=env_id, agent=agent, groups=len(groups), group_size=k, difficulty=difficulty, seed_offset=seed_offset,
        mean_reward=mean, reward_std=std,
        success_rate=sum(bool(s) for g in groups for s in g.successes) / len(rewards),
        pass_at={j: sum(pass_at_k(c, n, j) for c, n in counts) / len(counts) for j in range(1, k + 1)},
        pass_hat={j: pass_hat_k(counts, j) for j in range(1, k + 1)},
        per_group=list(groups), seconds=seconds, **share)
    report.decisions = decision_accuracy(
        {"decision": g.decision, "success": ok} for g in groups for ok in g.successes)
    return report


def summarize(records: Iterable[dict], *, env_id: str | None = None, agent: str | None = None,
              difficulty: int | None = None, seed_offset: int | None = None) -> CalibrationReport:
    """A :class:`CalibrationReport` from trajectory records (grouped by ``seed``; needs ``reward``, ``success``).

    Records of several envs must not be mixed (filter by ``env_id`` first). Every seed must have
    the same number of records.
    """
    by_seed: dict[int, Group] = {}
    records = list(records)
    if env_id is not None:
        records = [r for r in records if r.get("env_id", env_id) == env_id]
    envs = {r.get("env_id") for r in records if r.get("env_id") is not None}
    if len(envs) > 1:
        raise ValueError(f"records of several envs ({sorted(envs)}); pass env_id= to pick one")
    for r in sorted(records, key=lambda r: (int(r["seed"]), int(r.get("sample", 0)))):
        g = by_seed.setdefault(int(r["seed"]), Group(int(r["seed"]), [], [], record_decision(r)))
        g.rewards.append(float(r["reward"]))
        g.successes.append(bool(r.get("success")))
    groups = [by_seed[s] for s in sorted(by_seed)]
    if seed_offset is None:
        seed_offset = groups[0].seed if groups else 0
    return summarize_groups(groups, env_id=env_id or (envs.pop() if envs else ""),
                            agent=agent or (records[0].get("agent", "") if records else ""),
                            difficulty=difficulty, seed_offset=seed_offset)


# ------------------------------------------------------------------------------------------------ running


def make_seeded_agent(name: str, seed: int, **kwargs: Any) -> Any:
    """Build the registered agent ``name`` with sampling seed ``seed`` if its factory takes one.

    Deterministic agents (the oracle, planted-deficit agents) take no seed and are built as they are.
    """
    from .agents import _AGENT_FACTORIES, agent_names, make_agent

    agent_names()  # load the agent modules, so that the factory below exists
    factory = _AGENT_FACTORIES.get(name)
    if factory is not None and "seed" not in kwargs:
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            params = {}
        if "seed" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs["seed"] = seed
    return make_agent(name, **kwargs)


def run_calibration(env: str, agent: str | Callable[[int], Any], groups: int, group_size: int, *,
                    difficulty: int | None = None, seed_offset: int = 0, agent_seed: int = 0,
                    env_kwargs: dict | None = None, agent_kwargs: dict | None = None,
                    progress: bool = False) -> CalibrationReport:
    """Run ``groups`` × ``group_size`` episodes of ``env`` with ``agent`` and summarize them.

    Args:
        env: a registered env id.
        agent: a registered agent name (built per member with :func:`make_seeded_agent`), or a
            function ``sampling_seed -> agent``.
        groups: G, the number of env seeds (``seed_offset`` .. ``seed_offset + G - 1``).
        group_size: K, rollouts per seed; member ``j`` gets sampling seed ``agent_seed + j``.
        difficulty: passed to the env as the ``difficulty`` kwarg when set.
        env_kwargs: more ``gym.make`` kwargs.
        agent_kwargs: more kwargs for a named agent (e.g. ``{"p": 0.5}`` for ``tau:noisy``).
        progress: show a progress bar (tqdm, when installed).

    Returns:
        The :class:`CalibrationReport`, with the per-group rewards.
    """
    import time

    import gymnasium as gym

    from . import rollout

    if groups < 1 or group_size < 1:
        raise ValueError(f"groups and group_size must be >= 1, got {groups} and {group_size}")
    kwargs = dict(env_kwargs or {})
    if difficulty is not None:
        kwargs["difficulty"] = difficulty
    if isinstance(agent, str):
        name = agent
        members = [make_seeded_agent(agent, agent_seed + j, **(agent_kwargs or {})) for j in range(group_size)]
    else:
        members = [agent(agent_seed + j) for j in range(group_size)]
        name = getattr(members[0], "name", type(members[0]).__name__)
    bar = _bar(groups * group_size, f"calibrate {env}", progress)
    t0 = time.perf_counter()
    made = gym.make(env, **kwargs)
    try:
        out = []
        for g in range(groups):
            seed = seed_offset + g
            rewards, successes, decision = [], [], None
            for member in members:
                record = rollout(made, member, seed=seed)
                rewards.append(float(record["reward"]))
                successes.append(bool(record["success"]))
                decision = record_decision(record)
                if bar is not None:
                    bar.update(1)
            out.append(Group(seed, rewards, successes, decision))
    finally:
        made.close()
        if bar is not None:
            bar.close()
    return summarize_groups(out, env_id=env, agent=name, difficulty=difficulty, seed_offset=seed_offset,
                            seconds=time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------ isolation

#: The planted-deficit agents of the τ² domains and the capability each lacks (``trace_envs.domains.agents``).
DEFICIT_AGENTS = {
    "tau:skip_precondition": "precondition_verification",
    "tau:stop_after_first": "multi_step_completion",
    "tau:wrong_record": "structured_data_reasoning",
    "tau:sloppy_arguments": "tool_calling_precision",
}
#: Isolation thresholds: the agent lacking the env's capability scores at most LOW, every other one at least HIGH.
LOW, HIGH = 0.5, 0.75
#: Capabilities every write rests on: an agent lacking one fails any env that needs an exact write once attempts
#: earn nothing (the ``-v1`` rewards), so its deficit agent is held to no floor on the other envs.
PREREQUISITES = frozenset({"tool_calling_precision"})


def deficit_rewards(env: str, seeds: Iterable[int], *, difficulty: int | None = None,
                    agents: Sequence[str] = ("oracle", *DEFICIT_AGENTS), env_kwargs: dict | None = None) -> dict:
    """Mean reward of each named agent on ``env`` over ``seeds`` (one episode per seed; the same seeds for all)."""
    import gymnasium as gym

    from . import rollout

    kwargs = dict(env_kwargs or {})
    if difficulty is not None:
        kwargs["difficulty"] = difficulty
    seeds = list(seeds)
    made = gym.make(env, **kwargs)
    try:
        return {name: sum(rollout(made, make_seeded_agent(name, s), seed=s)["reward"] for s in seeds) / len(seeds)
                for name in agents}
    finally:
        made.close()


def isolation_problems(capability: str, rewards: dict, low: float = LOW, high: float = HIGH) -> list[str]:
    """Why ``rewards`` (agent -> mean reward) do not show that the env isolates ``capability`` (empty: it does).

    The deficit agent lacking ``capability`` must score at most ``low``; the oracle and the deficit
    agents lacking other capabilities at least ``high``, except those lacking a :data:`PREREQUISITES`
    capability (every write needs it). Agents not in :data:`DEFICIT_AGENTS` (other than ``oracle``) are
    ignored.
    """
    problems = []
    for agent, value in rewards.items():
        lacking = DEFICIT_AGENTS.get(agent)
        if agent != "oracle" and lacking is None:
            continue
        if lacking == capability:
            if value > low:
                problems.append(f"{agent} lacks {capability} but scores {value:.3f} > {low}")
        elif value < high and lacking not in PREREQUISITES:
            problems.append(f"{agent} does not lack {capability} but scores {value:.3f} < {high}")
    return problems


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)


__all__ = ["CRITERIA", "DEFICIT_AGENTS", "HIGH", "LOW", "CalibrationReport", "Group", "deficit_rewards",
           "isolation_problems", "PREREQUISITES", "decision_accuracy", "record_decision", "make_seeded_agent", "pass_at_k", "run_calibration", "summarize", "summarize_groups"]
