"""``trace envs``: list, inspect and check the registered environments.

    trace envs list [--kind target|capability] [--registry PATH]...
    trace envs show ID [--seed N] [--registry PATH]...
    trace envs check ID [--seeds N] [--registry PATH]...
    trace envs calibrate ID --agent NAME --groups G --group-size K [--difficulty D] [--seed-offset S]

``--registry`` loads a workspace registry (a ``registry.yaml`` or a folder
holding one) on top of the built-in registry and ``TRACE_REGISTRY``.
"""

from __future__ import annotations

import argparse
import inspect
import re

from . import CommandError, format_table, parse_key_values
from .rollout import load_registries

_TOOLS_SECTION = re.compile(r"# Tools\n.*?</tools>", re.DOTALL)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trace envs ...`` to the top-level parser."""
    envs = subparsers.add_parser("envs", help="list, inspect and check environments",
                                 description="List, inspect and check the registered TRACE environments.")
    envs.set_defaults(func=None, _parser=envs)
    verbs = envs.add_subparsers(title="subcommands", dest="envs_command", metavar="<subcommand>")

    registry_help = ("a workspace registry to load first (a registry.yaml or a folder holding one); "
                     "repeatable")

    p = verbs.add_parser("list", help="a table of every registered environment",
                         description="List the registered environments (built-in, TRACE_REGISTRY and --registry).")
    p.add_argument("--kind", help="show only this kind (target or capability)")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_list)

    p = verbs.add_parser("show", help="an environment's description, tools and a sample task",
                         description="Show an environment's documentation, its tools and the task of one seed.")
    p.add_argument("env_id", metavar="ID", help="a registered id, e.g. examples/warehouse_stock-v0")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample task (default: 0)")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_show)

    p = verbs.add_parser("check", help="run the conformance checks on an environment",
                         description="Run trace_envs.check_trace_env on one environment; exit 1 if a check fails.")
    p.add_argument("env_id", metavar="ID", help="a registered id, e.g. examples/warehouse_stock-v0")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="seeds for the oracle and seed checks (default: 20; 4 for envs that need docker)")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_check)

    _register_calibrate(verbs, registry_help)


# ---------------------------------------------------------------- helpers

def _entry(trace_envs, env_id: str):
    try:
        return trace_envs.get_entry(env_id)
    except KeyError as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise CommandError(f"{message}. Fix: check the id with `trace envs list`, or pass --registry PATH "
                           "for a workspace environment") from exc


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _signature(schema: dict) -> str:
    """``name(arg: type, opt: type?)`` from an OpenAI function schema."""
    from trace_envs.core.tools import _type_name

    fn = schema["function"]
    params = fn.get("parameters") or {}
    required = set(params.get("required", ()))
    args = [f"{name}: {_type_name(s)}" + ("" if name in required else "?")
            for name, s in (params.get("properties") or {}).items()]
    return f"{fn['name']}({', '.join(args)})"


# ---------------------------------------------------------------- verbs

def cmd_list(args: argparse.Namespace) -> int:
    trace_envs = load_registries(args.registry)
    from trace_envs.core.registry import KINDS

    if args.kind is not None and args.kind not in KINDS:
        raise CommandError(f"unknown kind {args.kind!r}; choose one of {', '.join(KINDS)}")
    entries = [e for e in trace_envs.registered() if args.kind is None or e.kind == args.kind]
    if not entries:
        print("No environments registered" + (f" of kind {args.kind!r}" if args.kind else "")
              + ". Add a workspace registry with --registry PATH or TRACE_REGISTRY.")
        return 0
    rows = [(e.id, e.kind, e.capability, e.target, e.requires, e.origin) for e in entries]
    print(format_table(["id", "kind", "capability", "target", "requires", "origin"], rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    trace_envs = load_registries(args.registry)
    import gymnasium as gym

    entry = _entry(trace_envs, args.env_id)
    cls = entry.load_class()
    print(entry.id)
    print("=" * len(entry.id))
    print(entry.description)
    print()
    facts = [("entry point", entry.entry_point), ("kind", entry.kind), ("capability", entry.capability),
             ("target", entry.target), ("max steps", entry.max_episode_steps), ("requires", entry.requires),
             ("kwargs", entry.kwargs), ("origin", entry.origin), ("registry", entry.source)]
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        if isinstance(value, (list, tuple)):
            value = ", ".join(value)
        print(f"{key.ljust(width)}  {value if value not in (None, '', {}) else '-'}")

    doc = inspect.cleandoc(cls.__doc__ or "")
    print()
    print(doc if doc else f"({cls.__name__} has no docstring)")
    from trace_envs.core.introspect import inherited_arguments

    for base, section in inherited_arguments(cls):
        print()
        print(f"Arguments shared with {base} (inherited):")
        print(section)

    env = gym.make(entry.id)
    try:
        try:
            observation, info = env.reset(seed=args.seed)
        except Exception as exc:
            raise CommandError(f"{entry.id}: reset(seed={args.seed}) failed ({type(exc).__name__}: {exc})") from exc
        tools = info.get("tools") or []
        title = f"Tools ({len(tools)})"
        print()
        print(title)
        print("-" * len(title))
        for schema in tools:
            print(f"  {_signature(schema)}")
            description = _first_line(schema["function"].get("description", ""))
            if description:
                print(f"      {description}")
        if not tools:
            print("  (none)")
        shown = _TOOLS_SECTION.sub(f"# Tools\n[{len(tools)} tool schemas, listed above]", observation)
        title = f"Sample task (seed {args.seed})"
        print()
        print(title)
        print("-" * len(title))
        print(shown)
        print()
        print(f"task fingerprint: {env.unwrapped.task_fingerprint()}")
    finally:
        env.close()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    trace_envs = load_registries(args.registry)
    entry = _entry(trace_envs, args.env_id)
    if args.seeds is not None and args.seeds < 2:
        raise CommandError(f"--seeds must be at least 2 (the seed checks compare seeds), got {args.seeds}")
    print(f"Checking {entry.id} on {args.seeds} seeds ...", flush=True)
    report = trace_envs.check_trace_env(entry.id, n_seeds=args.seeds)
    print(report.summary())
    return 0 if report.ok else 1



# ---------------------------------------------------------------- calibrate

_CALIBRATE_DOC = """\
Run G groups of K rollouts of an agent on one environment (every member of a group resets with
the same seed; group g uses seed S+g) and report what sets an environment's default difficulty:
mean reward, success rate, the share of all-0, all-1 and informative GRPO groups (docs/design.md, "The method's settings":
0.2-0.6 mean reward and success, <= 20%% all-0, <= 20%% all-1, >= 50%% informative, for the base
model), pass@1, pass@K and pass^K.

agents:
  a registered name      oracle, random, tau:skip_precondition, tau:stop_after_first, tau:wrong_record,
                         tau:sloppy_arguments, tau:noisy (drops each capability with probability p per
                         episode; --agent-kwarg p=0.3), tau:noisy_<deficit> (drops that one only), ...
                         Member j of a group gets sampling seed --agent-seed + j (deterministic agents
                         ignore it and give all-0 / all-1 groups only).
  hf:PATH                a local Hugging Face model folder (optionally --adapter DIR), sampled at
                         --temperature (default 1.0) so that the K members differ
  openai:MODEL@URL       a model behind an OpenAI-compatible endpoint, e.g. openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1

examples:
  trace envs calibrate trace/tau_airline-v0 --agent tau:noisy --groups 32 --group-size 8
  trace envs calibrate trace/structured_data_reasoning-v1 --agent tau:noisy --difficulty 4 --json cal.json
  trace envs calibrate trace/tau_retail-v0 --agent hf:runs/model --groups 16 --group-size 8 --temperature 0.8
"""


def _register_calibrate(verbs, registry_help: str) -> None:
    p = verbs.add_parser("calibrate", help="GRPO-group statistics and pass@k of an agent on an environment",
                         description=_CALIBRATE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env_id", metavar="ID", help="a registered id, e.g. trace/precondition_verification-v1")
    p.add_argument("--agent", default="tau:noisy",
                   help="a registered agent name, hf:PATH or openai:MODEL@URL (default: tau:noisy)")
    p.add_argument("--groups", type=int, default=32, metavar="G", help="number of groups = env seeds (default: 32)")
    p.add_argument("--group-size", type=int, default=8, metavar="K", help="rollouts per group (default: 8)")
    p.add_argument("--difficulty", type=int, metavar="D", help="the env's difficulty kwarg (default: the env's own)")
    p.add_argument("--seed-offset", type=int, default=0, metavar="S", help="first env seed (default: 0)")
    p.add_argument("--agent-seed", type=int, default=0, help="sampling seed of member 0 (default: 0)")
    p.add_argument("--agent-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword for a registered agent's constructor, e.g. p=0.3 (repeatable)")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="gym.make kwarg (repeatable), e.g. domain=retail")
    p.add_argument("--temperature", type=float, default=1.0, help="model agents: sampling temperature (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="model agents: tokens per turn at most")
    p.add_argument("--adapter", help="hf: a PEFT adapter folder")
    p.add_argument("--threads", type=int, default=1, help="hf: torch CPU threads (default: 1)")
    p.add_argument("--api-key", default="EMPTY", help="openai: the API key (default: EMPTY)")
    p.add_argument("--tool-mode", choices=["api", "text"], default="api",
                   help="openai: tools through the API's tools field, or as text in the prompt")
    p.add_argument("--in-flight", type=int, default=16, help="model agents: episodes open at once (default: 16)")
    p.add_argument("--out", metavar="JSONL", help="model agents: also keep the trajectories in this file")
    p.add_argument("--json", metavar="PATH", help="save the report (with per-group rewards) as JSON")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the statistics fall outside the calibration band (for base models)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_calibrate)


def _model_agent(args):
    """The model-backed agent named by ``--agent hf:PATH`` / ``openai:MODEL@URL``, with its default env kwargs;
    ``None`` for a registered (scripted) agent name."""
    from pathlib import Path

    spec = args.agent
    if spec.startswith("hf:"):
        path = spec[3:]
        if not path or not Path(path).exists():
            raise CommandError(f"--agent {spec}: no such model folder {path!r}")
        from trace_train.agents import HFAgent
        from trace_train.tiny.metadata import model_env_kwargs

        agent = HFAgent(path, adapter=args.adapter, threads=args.threads, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, seed=args.agent_seed)
        return agent, model_env_kwargs(path, args.env_id)
    if spec.startswith("openai:"):
        model, sep, url = spec[len("openai:"):].rpartition("@")
        if not sep or not model or not url:
            raise CommandError(f"--agent {spec}: write openai:MODEL@URL, e.g. openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
        from trace_train.agents import OpenAIChatAgent

        agent = OpenAIChatAgent(model, base_url=url, api_key=args.api_key, tool_mode=args.tool_mode,
                                temperature=args.temperature, max_tokens=args.max_new_tokens, seed=args.agent_seed)
        return agent, {}
    return None


def cmd_calibrate(args: argparse.Namespace) -> int:
    trace_envs = load_registries(args.registry)
    from trace_envs import calibration

    entry = _entry(trace_envs, args.env_id)
    if args.groups < 1 or args.group_size < 1:
        raise CommandError(f"--groups and --group-size must be >= 1, got {args.groups} and {args.group_size}")
    if args.difficulty is not None and not 1 <= args.difficulty <= 5:
        raise CommandError(f"--difficulty must be within 1..5, got {args.difficulty}")
    env_kwargs = parse_key_values(args.env_kwarg, "--env-kwarg")
    agent_kwargs = parse_key_values(args.agent_kwarg, "--agent-kwarg")
    if args.difficulty is not None:
        from trace_train.tiny.metadata import env_accepts

        if not env_accepts(entry.id, "difficulty"):
            raise CommandError(f"{entry.id} has no difficulty knob (its constructor takes no `difficulty`)")
    model = _model_agent(args)
    if model is None:
        from trace_envs.agents import agent_names

        if args.agent not in agent_names():
            raise CommandError(f"unknown agent {args.agent!r}; use hf:PATH, openai:MODEL@URL or one of: "
                               f"{', '.join(agent_names())}")
        try:
            report = calibration.run_calibration(
                entry.id, args.agent, args.groups, args.group_size, difficulty=args.difficulty,
                seed_offset=args.seed_offset, agent_seed=args.agent_seed, env_kwargs=env_kwargs,
                agent_kwargs=agent_kwargs, progress=not args.no_progress)
        except TypeError as exc:  # a bad --agent-kwarg / --env-kwarg reaches a constructor
            raise CommandError(f"{exc} (check --agent-kwarg / --env-kwarg)") from exc
    else:
        agent, defaults = model
        if agent_kwargs:
            raise CommandError("--agent-kwarg applies to registered agents only; model agents take --temperature, "
                               "--max-new-tokens, ...")
        if args.temperature <= 0 and args.group_size > 1:
            print("warning: --temperature 0 makes the K members of a group identical (greedy decoding)")
        import time

        from trace_train.rollouts import read_trajectories, record_key, run_rollouts

        kwargs = {**defaults, **env_kwargs}
        if args.difficulty is not None:
            kwargs["difficulty"] = args.difficulty
        seeds = list(range(args.seed_offset, args.seed_offset + args.groups))
        t0 = time.perf_counter()
        try:
            summary = run_rollouts(entry.id, agent, seeds, samples=args.group_size, out=args.out,
                                   in_flight=args.in_flight, env_kwargs=kwargs, progress=not args.no_progress,
                                   keep_records=True)
        finally:
            close = getattr(agent, "close", None)
            if callable(close):
                close()
        records = summary.records
        if args.out:  # a resumed run: this call ran only the missing episodes
            wanted = {(entry.id, s, k) for s in seeds for k in range(args.group_size)}
            records = [r for r in read_trajectories(args.out) if record_key(r) in wanted]
        report = calibration.summarize(records, env_id=entry.id, agent=getattr(agent, "name", args.agent),
                                       difficulty=args.difficulty, seed_offset=args.seed_offset)
        report.seconds = time.perf_counter() - t0
    print(report.format())
    print(f"{report.groups * report.group_size} episodes in {report.seconds:.1f} s")
    if args.json:
        import json
        from pathlib import Path

        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"report: {path}")
    return 1 if args.check and not report.in_band else 0
