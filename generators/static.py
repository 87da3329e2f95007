"""Static checks on a generated env module's source (admission step (a), see :mod:`generators.admit`).

The source is parsed, never imported, here. What a capability env needs is small: the standard
library's pure modules, numpy, gymnasium, faker and ``trace_envs``. Everything that reaches the
machine (files, processes, network, foreign memory) or the interpreter's internals (``eval``,
dynamic imports, dunder attributes that lead to ``__builtins__``) is refused with the line it is on.

These checks are a fast first filter with clear messages, **not the security boundary**: a static
check of Python cannot be one (an attribute can always be reached some other way). The boundary is
the sandbox: the module only ever runs in a bubblewrap worker (:mod:`trace_envs.core.sandboxed`), at
admission and at every later use, and admission's verdicts are computed outside it. What this filter
catches early is what a well-meaning generator should not write and what an attacker tries first:
aliases of ``eval``/``exec``, ``operator.attrgetter``, computed or private ``getattr`` on modules,
``numpy.ctypeslib``/``DataSource``/``memmap``/``save``, ``setsid``, frame walks, writing-mode
``open`` (also through ``**{'mode': 'w'}`` or ``Path.open('w')``), patching or re-registering what
another module defines (``gymnasium.make = ...``, ``register(...)``).

A generated module also carries its registration as a literal dict::

    REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "GeneratedEnv",
                    "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                    "description": "one line", "answer_tools": []}

``answer_tools`` names tools the target lacks that only carry the agent's final answer (they must be
called ``submit_*``, e.g. ``submit_location``); every other tool must be one of the target's.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

#: Top-level modules a generated env may import.
ALLOWED_IMPORTS = frozenset({
    "__future__", "abc", "bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "enum",
    "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator", "random",
    "re", "statistics", "string", "textwrap", "typing", "numpy", "gymnasium", "faker", "trace_envs",
})
#: Modules refused with a specific reason (everything else off the allow-list is refused too).
DANGEROUS_IMPORTS = {
    "os": "operating-system access", "sys": "interpreter internals", "subprocess": "spawning processes",
    "multiprocessing": "spawning processes", "socket": "network access", "ssl": "network access",
    "http": "network access", "urllib": "network access", "requests": "network access",
    "ctypes": "foreign memory access", "cffi": "foreign memory access", "importlib": "dynamic imports",
    "builtins": "reaching the builtins", "shutil": "file system writes", "pathlib": "file system access",
    "tempfile": "file system writes", "io": "file access", "pickle": "arbitrary code on load",
    "marshal": "arbitrary code on load", "threading": "threads that outlive the episode", "signal": "signals",
    "time": "the clock (a task must be a pure function of the seed)", "gc": "interpreter internals",
    "inspect": "interpreter internals",
}
#: Parts of ``trace_envs`` that reach outside the process (containers, the Docker daemon, HTTP endpoints).
FORBIDDEN_PROJECT_MODULES = {"trace_envs.swe.sandbox": "starting containers", "trace_envs.swe.images":
                             "building Docker images", "trace_envs.swe.sandbox_pytest": "running commands",
                             "trace_envs.swe.sandbox_tree": "running commands",
                             "trace_envs.core.llm": "network requests", "trace_envs.domains.user": "network requests"}
#: Builtins whose call is refused anywhere.
FORBIDDEN_CALLS = {
    "eval": "dynamic code", "exec": "dynamic code", "compile": "dynamic code", "__import__": "a dynamic import",
    "globals": "interpreter internals", "locals": "interpreter internals", "vars": "interpreter internals",
    "breakpoint": "a debugger hook", "input": "reading the terminal", "exit": "exiting the process",
    "quit": "exiting the process", "memoryview": "raw memory access",
}
#: Attribute names that lead out of the sandboxed surface through an allowed module
#: (e.g. ``numpy.os`` or ``gymnasium.envs.registration.importlib``).
FORBIDDEN_ATTRIBUTES = frozenset({
    "os", "sys", "subprocess", "socket", "ctypes", "builtins", "importlib", "shutil", "system", "popen", "Popen",
    "fork", "forkpty", "spawnv", "spawnl", "execv", "execve", "execl", "kill", "remove", "unlink", "rmdir",
    "rmtree", "write_text", "write_bytes", "_exit", "exec_module", "load_module", "import_module", "dlopen",
    # processes and foreign code through allowed packages (numpy, gymnasium)
    "setsid", "setpgid", "setpgrp", "daemon", "ctypeslib", "distutils", "exec_command", "load_env_creator",
    "AsyncVectorEnv", "vector", "f2py",
    # files and the network through allowed packages
    "DataSource", "memmap", "open_memmap", "save", "savez", "savez_compressed", "savetxt", "tofile", "FileHandler",
    "cli", "tempfile", "pathlib", "io", "inspect", "logging", "pickle", "marshal", "threading", "multiprocessing",
    "urllib", "http", "gc",
    # reaching code by name, frames, the interpreter
    "attrgetter", "methodcaller", "currentframe", "_getframe", "f_back", "f_globals", "f_locals", "f_builtins",
    "f_code", "gi_frame", "cr_frame", "ag_frame", "tb_frame", "tb_next",
    # the registries and constructors of the process that imports the env
    "make", "register", "registry", "load_registry", "register_entries", "register_agent", "load_default_registries",
})
#: Top-level modules' submodules refused although the package is allowed.
FORBIDDEN_SUBMODULES = {"numpy.ctypeslib": "foreign memory access", "numpy.distutils": "running commands",
                        "numpy.f2py": "running commands", "numpy.testing": "running commands",
                        "numpy.lib.format": "file access", "numpy.lib.npyio": "file access",
                        "gymnasium.vector": "spawning processes", "gymnasium.envs.registration": "the registry",
                        "faker.cli": "writing files"}
#: Dunder attributes a plain class needs; every other ``__x__`` attribute is refused (they reach the builtins).
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__", "__post_init__", "__repr__", "__str__", "__eq__",
                             "__hash__", "__len__", "__iter__", "__contains__", "__lt__", "__le__", "__gt__",
                             "__ge__", "__getitem__", "__bool__", "__future__", "__all__", "__annotations__"})
REGISTRATION_KEYS = {"id": str, "class": str, "max_episode_steps": int, "kwargs": dict, "description": str,
                     "answer_tools": list}


@dataclass
class StaticFinding:
    """One refused construct: which check, the line, and why."""

    check: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


#: The static checks, in report order (name, what it refuses).
STATIC_CHECKS = (
    ("source parses", "syntax errors"),
    ("imports on the allow-list", "imports outside the standard-library subset, numpy, gymnasium, faker, trace_envs"),
    ("no dynamic code", "eval, exec, compile, __import__ and friends"),
    ("no file writes", "open() for writing"),
    ("no process, network or foreign-memory access", "os, subprocess, socket, ctypes reached through attributes"),
    ("no dunder escapes", "dunder attributes and names that reach the builtins"),
    ("registration block", "a literal REGISTRATION dict naming a class defined in the module"),
)


#: Names whose first argument may be inspected with getattr()/setattr() by a literal private name.
_OWN = ("self", "cls")


class _Visitor(ast.NodeVisitor):
    def __init__(self, imported: set[str] | None = None) -> None:
        self.findings: list[StaticFinding] = []
        self.imported = imported or set()  # names bound by imports: modules and what they define

    def add(self, check: str, node: ast.AST, reason: str) -> None:
        self.findings.append(StaticFinding(check, getattr(node, "lineno", 0), reason))

    def _import(self, node: ast.AST, module: str) -> None:
        top = module.split(".")[0]
        sub = next((m for m in FORBIDDEN_SUBMODULES if module == m or module.startswith(m + ".")), None)
        if sub is not None:
            self.add("no process, network or foreign-memory access", node,
                     f"imports {module} ({FORBIDDEN_SUBMODULES[sub]} is not allowed in an env)")
            return
        project = next((m for m in FORBIDDEN_PROJECT_MODULES if module == m or module.startswith(m + ".")), None)
        if project is not None:
            self.add("no process, network or foreign-memory access", node,
                     f"imports {module} ({FORBIDDEN_PROJECT_MODULES[project]} is not allowed in an env)")
        elif top in DANGEROUS_IMPORTS:
            self.add("imports on the allow-list", node, f"imports {module} ({DANGEROUS_IMPORTS[top]} is not allowed "
                                                        f"in an env)")
        elif top not in ALLOWED_IMPORTS:
            self.add("imports on the allow-list", node, f"imports {module}, which is not on the allow-list "
                                                        f"({', '.join(sorted(ALLOWED_IMPORTS))})")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._import(node, alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add("imports on the allow-list", node, "a relative import (a generated module is a single file)")
        else:
            self._import(node, node.module or "")
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in FORBIDDEN_PROJECT_MODULES:
                    self.add("no process, network or foreign-memory access", node,
                             f"imports {full} ({FORBIDDEN_PROJECT_MODULES[full]} is not allowed in an env)")
                elif alias.name in FORBIDDEN_ATTRIBUTES or alias.name in DANGEROUS_IMPORTS:
                    self.add("no process, network or foreign-memory access", node,
                             f"imports {alias.name!r} from {node.module}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Name):
            if fn.id in FORBIDDEN_CALLS:
                self.add("no dynamic code", node, f"calls {fn.id}() ({FORBIDDEN_CALLS[fn.id]})")
            elif fn.id == "open":
                self._check_open(node)
            elif fn.id in ("getattr", "setattr", "delattr", "hasattr"):
                name = node.args[1] if len(node.args) > 1 else None
                target = node.args[0] if node.args else None
                own = isinstance(target, ast.Name) and target.id in _OWN
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    self.add("no dunder escapes", node, f"{fn.id}() with a computed attribute name")
                elif name.value.startswith("__") or name.value in FORBIDDEN_ATTRIBUTES:
                    self.add("no dunder escapes", node, f"{fn.id}() of the attribute {name.value!r}")
                elif name.value.startswith("_") and not own:
                    self.add("no dunder escapes", node, f"{fn.id}() of the private attribute {name.value!r} of "
                                                        "something other than self")
                elif fn.id in ("setattr", "delattr") and not own:
                    self.add("no dunder escapes", node, f"{fn.id}() on something other than self (patching "
                                                        "another module or class is not allowed)")
        elif isinstance(fn, ast.Attribute) and fn.attr in ("open", "write_text", "write_bytes") \
                and not (isinstance(fn.value, ast.Name) and fn.value.id in ("self",)):
            if fn.attr == "open":
                self._check_open(node)
        self.generic_visit(node)

    def _check_open(self, node: ast.Call) -> None:
        if any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            self.add("no file writes", node, "open() with computed arguments (**kwargs or *args: the mode cannot be "
                                             "read)")
            return
        mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
        if mode is None and isinstance(node.func, ast.Name):  # open(file, mode)
            mode = node.args[1] if len(node.args) > 1 else None
        elif mode is None:  # Path.open(mode) takes the mode first, io/gzip.open(file, mode) second
            for arg in node.args[:2]:
                if not isinstance(arg, ast.Constant):
                    mode = arg  # computed: refused below
                    break
                if isinstance(arg.value, str) and re.fullmatch(r"[rwxabtU+]{1,4}", arg.value):
                    mode = arg
                    break
        if mode is None:
            return
        if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
            self.add("no file writes", node, "open() with a computed mode")
        elif set(mode.value) & set("wax+"):
            self.add("no file writes", node, f"open() for writing (mode {mode.value!r})")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        base = node.value.id if isinstance(node.value, ast.Name) else None
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        root = root.id if isinstance(root, ast.Name) else None
        if name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS:
            self.add("no dunder escapes", node, f"the dunder attribute {name}")
        elif name in FORBIDDEN_ATTRIBUTES:
            self.add("no process, network or foreign-memory access", node, f"the attribute .{name}")
        elif name.startswith("_") and base in self.imported:
            self.add("no dunder escapes", node, f"the private attribute {base}.{name} of an imported module or class")
        elif isinstance(node.ctx, (ast.Store, ast.Del)) and root in self.imported:
            self.add("no dunder escapes", node, f"assigns {ast.unparse(node)}: patching an imported module or class "
                                                "is not allowed (subclass it instead)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("__") and node.id.endswith("__") and node.id not in ALLOWED_DUNDERS \
                and node.id not in FORBIDDEN_CALLS:
            self.add("no dunder escapes", node, f"the name {node.id}")
        elif node.id in FORBIDDEN_CALLS and not self._called(node):
            # e = eval; f = exec: an alias is the same dynamic code
            self.add("no dynamic code", node, f"refers to {node.id} ({FORBIDDEN_CALLS[node.id]}) without calling it "
                                              "(an alias?)")
        self.generic_visit(node)

    def _called(self, node: ast.Name) -> bool:
        return id(node) in self.callees

    def visit(self, node: ast.AST):  # noqa: D102 - records every call's callee name first
        if not hasattr(self, "callees"):
            self.callees = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
        return super().visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and any(s in node.value for s in ("__builtins__", "__subclasses__",
                                                                         "__globals__", "__code__", "__import__")):
            self.add("no dunder escapes", node, "a string naming an interpreter internal")


def read_registration(tree: ast.Module) -> tuple[dict | None, list[StaticFinding]]:
    """The module's ``REGISTRATION`` literal (validated), or None and why."""
    check = "registration block"
    value, node = None, None
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "REGISTRATION"
                                                for t in stmt.targets):
            node = stmt
            try:
                value = ast.literal_eval(stmt.value)
            except ValueError:
                return None, [StaticFinding(check, stmt.lineno, "REGISTRATION must be a literal dict")]
    if node is None:
        return None, [StaticFinding(check, 0, "no module-level REGISTRATION = {...} dict")]
    problems = []
    if not isinstance(value, dict):
        return None, [StaticFinding(check, node.lineno, "REGISTRATION must be a dict")]
    for key, typ in REGISTRATION_KEYS.items():
        if key in ("answer_tools", "kwargs") and key not in value:
            continue
        if not isinstance(value.get(key), typ) or isinstance(value.get(key), bool):
            problems.append(StaticFinding(check, node.lineno, f"REGISTRATION[{key!r}] must be a {typ.__name__}"))
    extra = sorted(set(value) - set(REGISTRATION_KEYS))
    if extra:
        problems.append(StaticFinding(check, node.lineno, f"unknown REGISTRATION keys {extra}"))
    if isinstance(value.get("class"), str) and value["class"] not in classes:
        problems.append(StaticFinding(check, node.lineno, f"REGISTRATION names class {value['class']!r}, which the "
                                                          "module does not define at top level"))
    for name in value.get("answer_tools") or []:
        if not (isinstance(name, str) and name.startswith("submit_")):
            problems.append(StaticFinding(check, node.lineno,
                                          f"answer tool {name!r}: answer tools are called submit_*"))
    return (None if problems else value), problems


def static_check(source: str) -> tuple[dict[str, list[StaticFinding]], dict | None]:
    """Run every static check; returns ({check name: findings}, the REGISTRATION dict or None)."""
    out: dict[str, list[StaticFinding]] = {name: [] for name, _ in STATIC_CHECKS}
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        out["source parses"].append(StaticFinding("source parses", exc.lineno or 0, f"syntax error: {exc.msg}"))
        return out, None
    imported: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                imported.add((alias.asname or alias.name).split(".")[0])
    visitor = _Visitor(imported)
    visitor.visit(tree)
    for f in visitor.findings:
        out[f.check].append(f)
    registration, problems = read_registration(tree)
    out["registration block"].extend(problems)
    return out, registration
