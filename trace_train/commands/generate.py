"""``trace generate``: write, admit and register one capability env per spec.

    trace generate --spec runs/base/diagnosis --workspace my_envs            # offline templates
    trace generate --spec specs/precondition_verification.json --workspace my_envs \\
        --llm http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B --attempts 3     # the LLM generator agent
    trace envs list --registry my_envs                                        # the admitted envs

Each spec (``specs/<capability>.json`` from ``trace diagnose``) gets an env module, written by the
offline generator (a template of the built-in family that matches the capability) or, with
``--llm``, by the generator agent. Nothing is registered before it passes admission: static checks on
the source, then the conformance suite, determinism across processes, schema identity with the
target, reward-hacking probes and calibration, computed here against the module running in a
sandboxed worker (the same proxy that every later use of the env goes through). Admitted modules go to
``WORKSPACE/envs/`` with their admission report beside them, and are appended to
``WORKSPACE/registry.yaml``; every attempt (prompt, reply, module, report) stays in ``--run-dir``.
Exit status 0 when at least one spec was admitted, 1 when none was, 2 on bad input.
"""

from __future__ import annotations

import argparse

from . import CommandError, format_table


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="write and admit capability envs from diagnosis specs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, action="append", metavar="SPEC.json|RUN_DIR",
                   help="a spec file, or a diagnosis/run folder holding specs/ (repeatable)")
    p.add_argument("--workspace", required=True, metavar="DIR", help="the workspace registry folder (created)")
    p.add_argument("--run-dir", metavar="DIR", help="where attempts are kept (default: beside the workspace, "
                                                    "generate-runs/<run id>)")
    p.add_argument("--llm", metavar="URL", help="OpenAI-compatible base URL of the generator model")
    p.add_argument("--model", help="the generator model's name (with --llm)")
    p.add_argument("--api-key", default="EMPTY", help="API key for --llm (default: EMPTY)")
    p.add_argument("--attempts", type=int, default=3, help="attempts per spec (default: 3)")
    p.add_argument("--focus-share", type=float, metavar="F",
                   help="offline generator: share of the episodes drawn from the evidence's request families "
                        "(default 0.75; 1.0 isolates the capability)")
    p.add_argument("--temperature", type=float, default=0.7, help="--llm: sampling temperature (default: 0.7)")
    p.add_argument("--max-tokens", type=int, default=4096, help="--llm: reply token budget (default: 4096)")
    p.add_argument("--timeout", type=float, default=300.0, help="--llm: seconds per request (default: 300)")
    p.add_argument("--admission-timeout", type=float, default=300.0,
                   help="wall-clock limit of one module's dynamic checks in seconds (default: 300)")
    p.add_argument("--memory-mb", type=int, default=2048, help="memory limit of the admission process (MB)")
    p.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default="auto",
                   help="auto: bubblewrap, and without it refuse unless --unsandboxed is given; bwrap: bubblewrap "
                        "required; none: explicitly unsandboxed (a plain subprocess, with a warning)")
    p.add_argument("--calibration-agent", metavar="NAME",
                   help="calibrate against this registered scripted agent (e.g. tau:noisy) instead of the "
                        "built-in stand-in (the deficit agent / random / oracle mixture)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from generators.admit import AdmissionConfig
    from generators.pipeline import GenerationError, generate

    if (args.llm is None) != (args.model is None):
        raise CommandError("--llm URL and --model NAME go together")
    if args.focus_share is not None and args.llm:
        raise CommandError("--focus-share is the offline generator's; the LLM generator chooses its own task mix")
    try:
        config = AdmissionConfig(timeout_s=args.admission_timeout, memory_mb=args.memory_mb, sandbox=args.sandbox,
                                 calibration_agent=args.calibration_agent)
        options = {"temperature": args.temperature, "max_tokens": args.max_tokens, "timeout": args.timeout}
        results = generate(args.spec, args.workspace, run_dir=args.run_dir, llm_url=args.llm, model=args.model,
                           attempts=args.attempts, progress=not args.no_progress, api_key=args.api_key,
                           config=config, llm_options=options if args.llm else None,
                           focus_share=args.focus_share)
    except (GenerationError, ValueError, RuntimeError) as exc:
        raise CommandError(str(exc)) from None
    rows = [[r.capability, "yes" if r.admitted else "no", r.env_id, r.attempts,
             r.module if r.admitted else r.report_md, (r.reason or "").splitlines()[0][:100] if r.reason else ""]
            for r in results]
    print(format_table(["capability", "admitted", "env id", "attempts", "module / report", "reason"], rows))
    admitted = [r for r in results if r.admitted]
    print(f"\nadmitted {len(admitted)} of {len(results)}; workspace: {args.workspace} "
          f"(use it with --registry {args.workspace} or TRACE_REGISTRY={args.workspace})")
    return 0 if admitted or not results else 1
