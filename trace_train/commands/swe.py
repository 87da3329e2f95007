"""``trace swe``: images, repositories, validated instances and cleanup for the SWE environments.

    trace swe build-image [--force] [--from-registry IMAGE]
    trace swe add-repo pypi:NAME==VERSION | git:/path[@rev] | dir:/path [--key K] [--tests PATH]... [--python-path DIR]...
                       [--requirement REQ]... [--env NAME=VALUE]... [--pytest-arg ARG]...
    trace swe repos
    trace swe validate REPO [--candidates N] [--seed S] [--combine K] [--out DIR]
    trace swe validate --shipped [--drop-failing]      # re-grade every shipped instance (gold 1.0, cheats 0.0)
    trace swe validate --recheck FILE.jsonl... [--drop-failing] [--refresh-issues]
    trace swe instances [REPO]...
    trace swe cleanup [--only-dead]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import CommandError, format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trace swe ...`` to the top-level parser."""
    swe = subparsers.add_parser("swe", help="SWE repositories, sandbox images, instances, cleanup",
                                description="Manage the SWE environments' images, repositories and task instances.")
    swe.set_defaults(func=None, _parser=swe)
    verbs = swe.add_subparsers(title="subcommands", dest="swe_command", metavar="<subcommand>")

    p = verbs.add_parser("build-image", help="build the sandbox base image (skipped when it exists)")
    p.add_argument("--force", action="store_true", help="rebuild even if an image with the same content tag exists")
    p.add_argument("--from-registry", metavar="IMAGE", help="build FROM a registry image instead of debootstrap")
    p.add_argument("--repos", nargs="*", metavar="REPO", help="also build these repositories' layers ('default': all)")
    p.set_defaults(func=cmd_build_image)

    p = verbs.add_parser("add-repo", help="add a repository: fetch it, build its image, check its clean suite passes")
    p.add_argument("source", help="pypi:NAME==VERSION, git:/path[@rev] or dir:/path")
    p.add_argument("--key", help="short name (default: derived from the source)")
    p.add_argument("--tests", action="append", default=[], metavar="PATH", help="test paths (default: detected)")
    p.add_argument("--python-path", action="append", default=[], metavar="DIR", help="PYTHONPATH dirs (default: detected)")
    p.add_argument("--requirement", action="append", default=[], metavar="REQ",
                   help="extra PyPI requirement for the tests (the sdist's test extras and requirement files are read "
                        "already)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable of the test process (e.g. a pure-Python switch)")
    p.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                   help="extra pytest argument, e.g. --pytest-arg=--deselect=tests/test_x.py::test_slow")
    p.set_defaults(func=cmd_add_repo)

    p = verbs.add_parser("repos", help="list known repositories")
    p.set_defaults(func=cmd_repos)

    p = verbs.add_parser("validate", help="inject candidate bugs and keep those the tests validate",
                         description="Inject candidate bugs into REPO and keep those its tests validate; or, with "
                                     "--shipped / --recheck FILE, re-grade stored instances: the gold patch must "
                                     "score 1.0, the empty patch, deleted and edited failing tests 0.0.")
    p.add_argument("repo", nargs="?", help="a repository key (see `trace swe repos`)")
    p.add_argument("--shipped", action="store_true", help="re-grade every instance shipped with the package")
    p.add_argument("--recheck", type=Path, nargs="*", default=None, metavar="FILE",
                   help="re-grade the instances of these <repo>.jsonl files")
    p.add_argument("--drop-failing", action="store_true", help="with --shipped/--recheck: rewrite the files "
                   "without the instances that fail a check")
    p.add_argument("--refresh-issues", action="store_true", help="with --shipped/--recheck: rewrite the issue texts "
                   "from a run of each bugged tree (failing tests and their error messages)")
    p.add_argument("--candidates", type=int, default=20, help="candidate bugs to try")
    p.add_argument("--seed", type=int, default=0, help="seed of the candidate sampling")
    p.add_argument("--combine", type=int, default=0, help="also build up to K two-bug instances")
    p.add_argument("--out", type=Path, default=None, help="instance directory (default: the user cache)")
    p.set_defaults(func=cmd_validate)

    p = verbs.add_parser("instances", help="count validated instances per repository")
    p.add_argument("repos", nargs="*", help="repository keys (default: all known)")
    p.set_defaults(func=cmd_instances)

    p = verbs.add_parser("cleanup", help="remove the sandbox containers TRACE started",
                         description="Remove the containers TRACE started (the run label set at `docker run`; a "
                                     "container someone else ran from a TRACE image is never touched).")
    p.add_argument("--only-dead", action="store_true", help="only those whose owner process is gone (or whose "
                   "pid now names another process): safe while other TRACE runs are going on")
    p.set_defaults(func=cmd_cleanup)


def _repo(key: str):
    from trace_envs.swe.repos import get_repo_spec, materialize

    try:
        return materialize(get_repo_spec(key))
    except KeyError as exc:
        raise CommandError(str(exc.args[0])) from exc


def cmd_build_image(args) -> int:
    from trace_envs.swe.images import build_base_image
    from trace_envs.swe.repos import DEFAULT_REPOS

    try:
        tag = build_base_image(force=args.force, from_registry=args.from_registry)
    except RuntimeError as exc:
        raise CommandError(str(exc)) from exc
    print(f"base image: {tag}")
    keys = list(DEFAULT_REPOS) if args.repos in (["default"],) else (args.repos or [])
    for key in keys:
        print(f"{key}: {_repo(key).image(verbose=True)}")
    return 0


def cmd_add_repo(args) -> int:
    import re
    from dataclasses import replace

    from trace_envs.swe.repos import materialize, save_repo, spec_for_source
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import run_tests

    bad_env = [e for e in args.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", e)]
    if bad_env:
        raise CommandError(f"--env takes NAME=VALUE, got {bad_env[0]!r}")
    try:
        spec = spec_for_source(args.source, key=args.key, test_paths=args.tests, python_path=args.python_path)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        raise CommandError(str(exc)) from exc
    extra = [r for r in args.requirement if r not in spec.requirements]
    spec = replace(spec, requirements=tuple(spec.requirements) + tuple(extra), env=tuple(args.env),
                   pytest_args=tuple(spec.pytest_args) + tuple(args.pytest_arg))
    if not spec.test_paths:
        raise CommandError(f"no tests found in {args.source}; name them with --tests PATH")
    repo = materialize(spec)
    print(f"{spec.key}: tests {list(spec.test_paths)}, PYTHONPATH {list(spec.python_path)}, "
          f"requirements {list(spec.requirements) or 'none'}"
          + (f", env {list(spec.env)}" if spec.env else "") + (f", pytest {list(spec.pytest_args)}" if spec.pytest_args else ""))
    try:
        image = repo.image(verbose=True)
    except RuntimeError as exc:
        raise CommandError(str(exc)) from exc
    with DockerSandbox(image) as box:
        run = run_tests(box, repo, max_output=20_000)
    passed = sum(s == "passed" for s in run.statuses.values())
    failed = {t: s for t, s in run.statuses.items() if s in ("failed", "error")}
    print(f"clean suite: {passed} passed, {len(failed)} failed/error, {run.seconds:.1f}s")
    if passed == 0:
        missing = sorted(set(re.findall(r"No module named '([\w.]+)'", run.output)))
        hint = ""
        if missing:
            tops = sorted({m.split(".")[0] for m in missing})
            hint = (f"\nthe tests import {', '.join(tops)}, which the sandbox does not have: add "
                    + " ".join(f"--requirement {t}" for t in tops) + " (the PyPI name may differ from the import name)")
        raise CommandError(f"the clean suite of {spec.key} has no passing test:\n{run.output[-1500:]}{hint}")
    save_repo(spec)
    print(f"added {spec.key}; next: trace swe validate {spec.key}")
    return 0


def cmd_repos(args) -> int:
    from trace_envs.swe.repos import known_repos

    rows = [(s.key, s.source, ",".join(s.test_paths)) for s in known_repos().values()]
    print(format_table(["key", "source", "tests"], rows))
    return 0


def cmd_validate(args) -> int:
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import generate_instances, save_instances

    if args.shipped or args.recheck is not None:
        return _recheck(args)
    if not args.repo:
        raise CommandError("name a repository (see `trace swe repos`), or use --shipped / --recheck FILE")
    repo = _repo(args.repo)
    image = repo.image(verbose=True)
    boxes = [DockerSandbox(image)]

    def restart():
        boxes.append(DockerSandbox(image))
        return boxes[-1]

    try:
        instances, st = generate_instances(repo, boxes[0], args.candidates, seed=args.seed, combine=args.combine,
                                           progress=True, restart=restart)
    finally:
        for box in boxes:
            box.close()
    path = save_instances(instances, repo.spec.key, args.out)
    print(f"{st.valid}/{st.candidates} candidates valid, {st.combined} combined, {st.flaky} flaky tests excluded; "
          f"wrote {path}")
    return 0


def _recheck(args) -> int:
    from trace_envs.swe.envs import load_repo
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import PACKAGED_INSTANCES, REFERENCE_CHECKS, recheck_instance_file

    files = sorted(PACKAGED_INSTANCES.glob("*.jsonl")) if args.shipped else []
    files += list(args.recheck or [])
    if not files:
        raise CommandError("no instance files to re-check")
    rows, failed = [], 0
    for path in files:
        good, bad = recheck_instance_file(Path(path), lambda repo: DockerSandbox(repo.image(verbose=True)), load_repo,
                                          progress=True, drop_failing=args.drop_failing,
                                          refresh_issues=args.refresh_issues)
        rows.append((Path(path).stem, len(good) + len(bad), len(good), len(bad)))
        for iid, rewards in bad:
            print(f"FAILED {iid}: {rewards}")
        failed += len(bad)
    print(format_table(["file", "instances", "pass all checks", "fail"], rows))
    print(f"checks per instance: {', '.join(f'{c} = {r}' for c, r in REFERENCE_CHECKS.items())}"
          + (f"; {failed} failing instance(s) dropped" if args.drop_failing and failed else ""))
    return 1 if failed and not args.drop_failing else 0


def cmd_instances(args) -> int:
    from trace_envs.swe.repos import known_repos
    from trace_envs.swe.tasks import load_instances

    keys = args.repos or list(known_repos())
    rows = []
    for key in keys:
        insts = load_instances([key])
        rows.append((key, sum(len(i["mutations"]) == 1 for i in insts), sum(len(i["mutations"]) > 1 for i in insts)))
    print(format_table(["repo", "single-bug", "multi-bug"], rows))
    return 0


def cmd_cleanup(args) -> int:
    from trace_envs.swe.sandbox import cleanup_containers

    try:
        n = cleanup_containers(only_dead_owners=args.only_dead)
    except RuntimeError as exc:
        raise CommandError(str(exc)) from exc
    print(f"removed {n} container(s)")
    return 0
