"""The process that hosts one sandboxed env (see :mod:`trace_envs.core.sandboxed`).

``python -m trace_envs.core.sandbox_worker FD_IN FD_OUT`` reads requests of the wire protocol
(:mod:`trace_envs.core.wire`) from ``FD_IN`` and writes one reply per request to ``FD_OUT``. It only
answers: the checks, the verdicts and the rewards' use all happen in the process that drives it. The
module's own prints go to stdout/stderr, which the parent keeps apart as untrusted text.

The first request must be ``init``. It is read with the standard library only, so that the clock
and the global random state are set (an admission run varies them) before ``trace_envs``, the env
module or anything they import is loaded.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


#: What builds each scripted policy kind of the wire protocol, named rather than imported: those agents live
#: above ``core`` (docs/design.md, "Layout"), and the worker loads the one an episode asks for.
POLICY_FACTORIES = {"tau_scripted": "trace_envs.domains.agents:TauScriptedAgent",
                    "agent": "trace_envs.agents:make_agent"}


def _factory(kind: str):
    import importlib

    module, _, name = POLICY_FACTORIES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def _read_line(stream) -> bytes | None:
    line = stream.readline()
    return line if line else None


def _prepare(init: dict) -> None:
    seed = init.get("random_seed")
    if seed is not None:
        import random

        random.seed(int(seed))  # a pre-seeded global random: a task that reads it changes with this seed


def describe_class(cls: type) -> dict:
    """What a caller may ask of the env class without importing it: its ``hint_text`` and the keyword
    arguments its constructor takes (following ``**kwargs`` handed on to a parent's constructor)."""
    from .introspect import constructor_params

    names, var_keyword = constructor_params(cls)
    hint = getattr(cls, "hint_text", None)
    return {"name": cls.__name__, "doc": (cls.__doc__ or "")[:4000], "hint_text": hint if isinstance(hint, str) else None,
            "init_params": names, "var_keyword": var_keyword}


class Host:
    """The env and the scripted policies of its current episode."""

    def __init__(self, init: dict):
        import importlib

        from trace_envs.core.env import TraceEnv
        from trace_envs.core.wire import InfoSender, space_to_wire, unpack

        root = init.get("module_root")
        if root and root not in sys.path:
            sys.path.insert(0, root)
        module = importlib.import_module(init["module"])
        cls = getattr(module, init["cls"], None)
        if not (isinstance(cls, type) and issubclass(cls, TraceEnv)):
            raise TypeError(f"{init['module']}:{init['cls']} is not a subclass of trace_envs.TraceEnv")
        kwargs = dict(unpack(init.get("kwargs")) or {})
        if init.get("render_mode") is not None:
            kwargs["render_mode"] = init["render_mode"]
        self.env = cls(**kwargs)
        self.sender = InfoSender()
        self.policies: dict[int, object] = {}
        self.last: tuple = ("", {})
        self.spaces = {"observation_space": space_to_wire(self.env.observation_space),
                       "action_space": space_to_wire(self.env.action_space),
                       "metadata": json.loads(json.dumps(getattr(self.env, "metadata", {}) or {}, default=str))}

    def _rng(self):
        """The env's ``np_random`` state, so that the proxy's follows it (gymnasium's seeding contract)."""
        rng = getattr(self.env, "_np_random", None)
        try:
            return rng.bit_generator.state if rng is not None else None
        except AttributeError:
            return None

    def handle(self, msg: dict) -> dict:
        from trace_envs.core.wire import pack, unpack

        op = msg.get("op")
        env = self.env
        if op == "reset":
            self.sender.clear()
            self.policies.clear()
            obs, info = env.reset(seed=msg.get("seed"), options=unpack(msg.get("options")))
            self.last = (obs, info)
            task = env.task_info() if hasattr(env, "task_info") else {}
            return {"observation": obs, "info": self.sender.delta(info), "task_info": pack(task), "rng": self._rng()}
        if op == "step":
            obs, reward, terminated, truncated, info = env.step(unpack(msg.get("action")))
            self.last = (obs, info)
            return {"observation": obs, "reward": float(reward), "terminated": bool(terminated),
                    "truncated": bool(truncated), "info": self.sender.delta(info), "rng": self._rng()}
        if op == "spaces":
            return dict(self.spaces)
        if op == "describe":
            return describe_class(type(env))
        if op == "query":
            what = msg.get("what")
            if what == "task_fingerprint":
                return {"value": env.task_fingerprint()}
            if what == "task_info":
                return {"value": pack(env.task_info())}
            if what == "task_spec":
                return {"value": pack(env.task_spec())}
            if what == "tool_defaults":
                toolset = getattr(env, "_toolset", None)
                specs = getattr(toolset, "specs", None) or {}
                defaults = {name: dict(getattr(spec, "defaults", {}) or {}) for name, spec in specs.items()}
                return {"value": pack(defaults)}
            if what == "write_tools":
                toolset = getattr(env, "_toolset", None)
                names = [t["function"]["name"] for t in env.tools] if toolset is not None else []
                return {"value": [n for n in names if toolset.is_write(n)]}
            if what == "open_resources":
                return {"value": [str(r) for r in getattr(env, "open_resources", lambda: [])()]}
            if what == "render":
                return {"value": env.render()}
            raise ValueError(f"unknown query {what!r}")
        if op == "policy":
            kind, args = msg.get("kind"), msg.get("args") or {}
            if kind == "oracle":
                policy = env.oracle()
            elif kind == "tau_scripted":
                policy = _factory(kind)(list(args.get("lacks") or []))
                policy.reset(env, *self.last)
            elif kind == "agent":
                policy = _factory(kind)(str(args.get("name")), **dict(args.get("kwargs") or {}))
                if hasattr(policy, "reset"):
                    policy.reset(env, *self.last)
            else:
                raise ValueError(f"unknown policy kind {kind!r}")
            handle = len(self.policies) + 1
            self.policies[handle] = policy
            return {"handle": handle}
        if op == "act":
            policy = self.policies.get(msg.get("handle"))
            if policy is None:
                raise ValueError("no such policy in this episode (policies end at reset)")
            return {"action": pack(policy(*self.last))}
        if op == "close":
            env.close()
            return {}
        raise ValueError(f"unknown op {op!r}")


def main(argv: list[str]) -> int:
    fd_in, fd_out = int(argv[1]), int(argv[2])
    rin = os.fdopen(fd_in, "rb")
    out = os.fdopen(fd_out, "wb", buffering=0)

    def send(message: dict) -> None:
        from trace_envs.core.wire import WireError, encode, error

        try:
            data = encode(message)
        except WireError as exc:
            data = encode(error(message.get("id", -1), f"the reply could not be encoded: {exc}"))
        out.write(data)

    first = _read_line(rin)
    if first is None:
        return 0
    init = json.loads(first)
    _prepare(init)
    try:
        host = Host(init)
    except BaseException as exc:  # the module's failure at import or construction, reported with its traceback
        send({"id": init.get("id", 0), "ok": False,
              "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-8)}"})
        return 1
    send({"id": init.get("id", 0), "ok": True, "result": host.spaces})
    from trace_envs.core.wire import WireError, decode, error, reply

    while True:
        line = _read_line(rin)
        if line is None:
            return 0
        try:
            msg = decode(line)
        except WireError as exc:
            send(error(-1, str(exc)))
            continue
        try:
            result = host.handle(msg)
        except MemoryError:
            send(error(msg["id"], "MemoryError: the env exceeded its memory limit"))
            continue
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: the env's failure, not ours
            send(error(msg["id"], f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-8)}"))
            continue
        send(reply(msg["id"], result))
        if msg.get("op") == "close":
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
