"""``trace rollout``: run an agent on N seeds × K samples of one or more environments.

    trace rollout --env examples/warehouse_stock-v0 --agent oracle --seeds 20 --out runs/oracle.jsonl
    trace rollout --env trace/tau_airline-v0 --agent hf --model ~/.cache/trace/models/bootstrap-... \\
        --seeds 0:50 --samples 4 --temperature 0.8 --in-flight 32 --out runs/base.jsonl --parquet
    trace rollout --env trace/tau_airline-v0 --agent openai --model Qwen/Qwen3-8B \\
        --base-url http://127.0.0.1:8000/v1 --seeds 50 --out runs/qwen.jsonl
    trace rollout --env trace/tau_airline-v0 --agent oracle --seeds 400 --out runs/o.jsonl --ray auto --ray-actors 8

Trajectories are appended to ``--out`` as episodes end; running the same command again after an
interruption runs only the missing (env, seed, sample) triples.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import CommandError, parse_key_values

REGISTRY_HELP = "a workspace registry to load first (a registry.yaml or a folder holding one); repeatable"


def parse_seeds(spec: str) -> list[int]:
    """``"50"`` → 0..49, ``"100:150"`` → 100..149, ``"1,5,9"`` → those seeds."""
    try:
        if ":" in spec:
            lo, hi = spec.split(":", 1)
            return list(range(int(lo), int(hi)))
        if "," in spec:
            return [int(s) for s in spec.split(",") if s.strip()]
        return list(range(int(spec)))
    except ValueError:
        raise CommandError(f"--seeds {spec!r} is not a count (50), a range (100:150) or a list (1,5,9)") from None


def load_registries(paths: list[str]):
    """Import ``trace_envs`` and load ``--registry`` paths (errors become CommandError)."""
    try:
        import trace_envs
    except Exception as exc:  # a broken TRACE_REGISTRY entry is the user's to fix, not a crash
        if type(exc).__name__ == "RegistryError":
            raise CommandError(f"{exc} (while loading TRACE_REGISTRY)") from exc
        raise
    for path in paths:
        try:
            trace_envs.load_registry(path)
        except trace_envs.RegistryError as exc:
            raise CommandError(str(exc)) from exc
    return trace_envs


def check_env_ids(trace_envs, env_ids: list[str]) -> None:
    for env_id in env_ids:
        try:
            trace_envs.get_entry(env_id)
        except KeyError as exc:
            raise CommandError(f"unknown env id {env_id!r}. Fix: check `trace envs list`, or pass --registry PATH "
                               "for a workspace environment") from exc


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rollout", help="run an agent on many seeds of environments (resumable JSONL)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", dest="envs", action="append", required=True, metavar="ID",
                   help="env id (repeatable)")
    p.add_argument("--agent", default="oracle",
                   help="hf (local model), openai (an OpenAI-compatible endpoint), or a registered agent name "
                        "such as oracle or random (default: oracle)")
    p.add_argument("--model", help="hf: a model folder; openai: the served model name")
    p.add_argument("--adapter", help="hf: a PEFT adapter folder")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="openai: the endpoint")
    p.add_argument("--api-key", default="EMPTY", help="openai: the API key (default: EMPTY)")
    p.add_argument("--tool-mode", choices=["api", "text"], default="api",
                   help="openai: tools through the API's tools field, or as text in the prompt")
    p.add_argument("--concurrency", type=int, default=8, help="openai: requests in flight at most")
    p.add_argument("--timeout", type=float, default=60.0, help="openai: seconds per request")
    p.add_argument("--seeds", default="20", help="a count (20), a range (100:150) or a list (1,5,9)")
    p.add_argument("--samples", type=int, default=1, help="episodes per (env, seed) (default: 1)")
    p.add_argument("--in-flight", type=int, default=8, help="episodes open at once (default: 8)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per turn at most")
    p.add_argument("--threads", type=int, default=1, help="hf: torch CPU threads (default: 1)")
    p.add_argument("--decode", choices=["auto", "fast", "hf"], default="auto",
                   help="hf: the hand-written decode loop (fast), model.generate (hf), or fast for the tiny "
                        "presets on CPU (auto, the default)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="env reset option (repeatable)")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="gym.make kwarg (repeatable), e.g. prompt=compact; a model bootstrapped here defaults "
                        "to the env kwargs it was trained with")
    p.add_argument("--out", required=True, help="trajectory JSONL file (appended; resumes)")
    p.add_argument("--parquet", action="store_true", help="also export the file as Parquet at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=REGISTRY_HELP)
    add_ray_arguments(p)
    p.add_argument("--ray-actors", type=int, default=4, metavar="N", help="--ray: actors hosting the envs (default: 4)")
    p.add_argument("--ray-cpus", type=float, default=1.0, metavar="CPUS",
                   help="--ray: CPUs per actor, fractions share a core (default: 1)")
    p.add_argument("--ray-per-actor", type=int, default=None, metavar="N",
                   help="--ray: episodes open at once per actor (default: --in-flight)")
    p.set_defaults(func=cmd_rollout)


def add_ray_arguments(p: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]``: run the episodes on Ray actors (docs/ray.md)."""
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the episodes on Ray actors: ADDRESS is auto (this machine's cluster), HOST:PORT or "
                        "ray://HOST:PORT; without it, a cluster already running here or a new local one "
                        "(docs/ray.md; needs pip install 'trace-rl[ray]')")


def ray_address(value: str | None) -> str | None:
    """The cluster address of a ``--ray`` value ('' = no address given)."""
    return value or None


def make_cli_agent(args):
    """The agent named by ``--agent`` and a function ``env_id -> default env kwargs`` that goes with it."""
    factory, default_kwargs = cli_agent_factory(args)
    return factory(), default_kwargs


def cli_agent_factory(args):
    """A picklable no-argument factory of the agent named by ``--agent`` (what a Ray actor builds) and a function
    ``env_id -> default env kwargs`` that goes with it."""
    import functools

    if args.agent == "hf":
        if not args.model:
            raise CommandError("--agent hf needs --model PATH (e.g. from `trace model bootstrap`)")
        if not Path(args.model).exists():
            raise CommandError(f"--model {args.model}: no such folder")
        from trace_train.agents import HFAgent
        from trace_train.tiny.metadata import model_env_kwargs

        factory = functools.partial(HFAgent, args.model, adapter=args.adapter, threads=args.threads,
                                    max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                    decode=args.decode)
        return factory, lambda env_id: model_env_kwargs(args.model, env_id)
    if args.agent == "openai":
        if not args.model:
            raise CommandError("--agent openai needs --model NAME (the served model name)")
        from trace_train.agents import OpenAIChatAgent

        return functools.partial(OpenAIChatAgent, args.model, base_url=args.base_url, api_key=args.api_key,
                                 tool_mode=args.tool_mode, temperature=args.temperature, max_tokens=args.max_new_tokens,
                                 timeout=args.timeout, concurrency=args.concurrency), lambda env_id: {}
    from trace_envs.agents import agent_names, make_agent

    try:
        make_agent(args.agent)  # an unknown name fails here, not on an actor
        return functools.partial(make_agent, args.agent), lambda env_id: {}
    except KeyError:
        raise CommandError(f"unknown agent {args.agent!r}; use hf, openai or one of: "
                           f"{', '.join(agent_names())}") from None


def cmd_rollout(args) -> int:
    trace_envs = load_registries(args.registry)
    check_env_ids(trace_envs, args.envs)
    seeds = parse_seeds(args.seeds)
    if args.samples < 1 or args.in_flight < 1:
        raise CommandError("--samples and --in-flight must be >= 1")
    options = parse_key_values(args.option, "--option")
    extra_kwargs = parse_key_values(args.env_kwarg, "--env-kwarg")
    if args.ray is not None:
        return _rollout_on_ray(args, options, extra_kwargs)
    agent, default_kwargs = make_cli_agent(args)
    env_kwargs = {env_id: {**default_kwargs(env_id), **extra_kwargs} for env_id in args.envs}
    from trace_train.rollouts import export_parquet, run_rollouts

    summary = run_rollouts(args.envs, agent, seeds, samples=args.samples, out=args.out, in_flight=args.in_flight,
                           reset_options=options or None, env_kwargs=env_kwargs.__getitem__,
                           progress=not args.no_progress)
    print(f"{summary.ran} episodes run, {summary.skipped} already in {args.out}; "
          f"mean reward {summary.mean_reward:.3f}, success {summary.success_rate:.3f}, "
          f"{summary.episodes_per_second:.2f} episodes/s")
    stats = getattr(agent, "stats", None)
    if stats is not None:
        print("agent: " + ", ".join(f"{k} {v}" for k, v in stats.as_dict().items()))
    if args.parquet:
        print(f"parquet: {export_parquet(args.out)}")
    close = getattr(agent, "close", None)
    if callable(close):
        close()
    return 0


def _rollout_on_ray(args, options: dict, extra_kwargs: dict) -> int:
    """``trace rollout --ray``: the same episodes into the same file, played on Ray actors."""
    from trace_train.backends import RolloutJob
    from trace_train.backends.ray_config import ConfigError, RaySection
    from trace_train.rollouts import export_parquet

    if options:
        raise CommandError("--option (reset options) is not supported with --ray; pass env kwargs with --env-kwarg")
    cfg = RaySection(address=ray_address(args.ray), num_actors=args.ray_actors, env_cpus=args.ray_cpus,
                     max_concurrent_per_actor=args.ray_per_actor or args.in_flight)
    try:
        cfg.validate()
    except ConfigError as exc:
        raise CommandError(str(exc).replace("ray.num_actors", "--ray-actors").replace("ray.env_cpus", "--ray-cpus")
                           .replace("ray.max_concurrent_per_actor", "--ray-per-actor")) from None
    try:
        from trace_train.backends.ray_backend import RayBackendError, connect, run_ray
    except ImportError as exc:
        raise CommandError(f"--ray needs Ray: pip install 'trace-rl[ray]' ({exc})") from None
    factory, default_kwargs = cli_agent_factory(args)
    env_kwargs = {env_id: {**default_kwargs(env_id), **extra_kwargs} for env_id in args.envs}
    job = RolloutJob(key=args.agent, make=factory, targets=list(args.envs), seeds=parse_seeds(args.seeds),
                     out=Path(args.out), samples=args.samples, in_flight=args.in_flight, env_kwargs=env_kwargs,
                     registries=list(args.registry), progress=not args.no_progress)
    try:
        connect(cfg.address)
        summary = run_ray([job], cfg)[0]
    except RayBackendError as exc:
        raise CommandError(str(exc)) from exc
    print(f"{summary.ran} episodes run on Ray, {summary.skipped} already in {args.out}; "
          f"mean reward {summary.mean_reward:.3f}, success {summary.success_rate:.3f}, "
          f"{summary.episodes_per_second:.2f} episodes/s"
          + (f"; {summary.actor_deaths} actors died and their episodes ran again" if summary.actor_deaths else ""))
    if args.parquet:
        print(f"parquet: {export_parquet(args.out)}")
    return 0
