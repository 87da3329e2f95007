"""The sandboxed-env proxy: generated env modules never run in the user's process.

``gym.make`` of a generated id (a workspace entry whose ``origin`` is ``generated:*``, or any entry
with ``sandbox: true``) returns a :class:`SandboxedEnv`. It starts one worker process per env
instance (:mod:`trace_envs.core.sandbox_worker`), which imports the module and answers
``reset``/``step``/``close`` over the wire protocol (:mod:`trace_envs.core.wire`); this process never
imports the module. The worker runs under bubblewrap:

* every namespace unshared (``--unshare-all``: network, pid, ipc, uts, user, cgroup), all capabilities
  dropped, ``--die-with-parent``; killing it tears down its pid namespace, so no process it started
  (a ``setsid`` daemon included) survives it;
* a file system of read-only binds of only ``/usr`` (the dynamic libraries), the interpreter, the
  virtual environment with its packages, ``trace_envs`` and the module's own folder; a private,
  empty tmpfs as ``/tmp`` (its scratch dir and ``HOME``); a ``/proc`` of its own pid namespace; no
  ``/etc`` beyond the loader's cache, no ``/run`` (no Docker socket), no home;
* an environment of an allow-list only (nothing inherited: no tokens, no proxies, no registries);
* ``RLIMIT_AS``/``RLIMIT_CPU``/``RLIMIT_FSIZE``/``RLIMIT_NPROC`` (:class:`SandboxLimits`) and a
  timeout per call.

A worker that dies, hangs, exceeds a limit or breaks the protocol ends the episode: ``step`` returns
``terminated=True`` with ``info["termination"] == "env_error"`` and the reason in
``info["env_error"]``; it never raises. The next ``reset`` starts a fresh worker.

Without bubblewrap a sandboxed env refuses to start (:class:`SandboxUnavailable`) unless the user
says ``unsandboxed`` explicitly (the ``--unsandboxed`` CLI flag, ``TRACE_UNSANDBOXED=1``, or
``trace_unsandboxed=True`` to ``gym.make``): it then runs in a plain subprocess with the same scrubbed
environment, limits and timeouts but with the user's file system and network, with a warning. A
*generated* env needs a second switch as well (``TRACE_UNSANDBOXED_GENERATED=1``,
``--unsandboxed-generated``): unsandboxed, nothing stops it reading what the user can.
"""

from __future__ import annotations

import atexit
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from . import wire

#: Set to 1 to let sandboxed envs run without bubblewrap (a plain subprocess; with a warning).
UNSANDBOXED_ENV = "TRACE_UNSANDBOXED"
#: The second switch a *generated* env needs to run without bubblewrap (``--unsandboxed-generated``): unsandboxed,
#: code a model wrote runs as you, and can read whatever you can (your files, the environment of your other
#: processes through ``/proc/PID/environ``), so ``TRACE_UNSANDBOXED`` alone runs only hand-written ``sandbox: true``
#: entries unsandboxed.
UNSANDBOXED_GENERATED_ENV = "TRACE_UNSANDBOXED_GENERATED"
#: The folder holding the ``trace_envs`` package the worker imports (the one this process runs).
_TRACE_ENVS = Path(__file__).resolve().parents[1]
_FAKETIME_LIBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                  "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")
_OUTPUT_TAIL_BYTES = 8192


class SandboxUnavailable(RuntimeError):
    """Bubblewrap is missing or unusable and running unsandboxed was not asked for."""


class WorkerError(RuntimeError):
    """The worker died, hung, exceeded a limit or broke the protocol (the message says which)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one worker process.

    Attributes:
        memory_mb: address space (``RLIMIT_AS``).
        cpu_s: CPU seconds over the worker's life (``RLIMIT_CPU``; generous, since one worker serves a
            whole training run: the per-call timeout is what bounds a slow step).
        file_mb: largest file it may write in its scratch dir (``RLIMIT_FSIZE``).
        tmpfs_mb: size of its scratch tmpfs (``/tmp``, bubblewrap's ``--size``): what all its files together
            may hold. A tmpfs lives in the host's shared memory, outside the worker's ``RLIMIT_AS``, so without
            this bound many files under ``file_mb`` each could fill the machine's memory. The worker's ``/``
            and ``/dev`` are remounted read-only, so the scratch tmpfs is the only memory-backed place it writes.
        nproc: processes the worker may add (``RLIMIT_NPROC``, on top of the user's running ones; the
            kernel does not enforce it for root; the pid namespace still ends every process with the worker).
        start_timeout_s: importing the module and building the env.
        call_timeout_s: any one ``reset``/``step``/query.
    """

    memory_mb: int = 2048
    cpu_s: int = 6 * 3600
    file_mb: int = 64
    tmpfs_mb: int = 128
    nproc: int = 64
    start_timeout_s: float = 60.0
    call_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.memory_mb < 256 or self.cpu_s < 1 or self.file_mb < 1 or self.nproc < 1 or self.tmpfs_mb < 1:
            raise ValueError("memory_mb must be at least 256 and cpu_s, file_mb, tmpfs_mb, nproc at least 1")
        if self.start_timeout_s <= 0 or self.call_timeout_s <= 0:
            raise ValueError("timeouts must be positive")


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker hosts and how it is started.

    Attributes:
        env_id: the id (for messages).
        module: the env module's import name (e.g. ``envs.precondition_verification_tau_airline_v0``).
        cls: the env class's name in it.
        module_root: the ``sys.path`` folder the module imports from.
        bind: the folder (or file) of that root exposed to the worker, read-only (its package folder).
        hash_seed: the worker's ``PYTHONHASHSEED``.
        clock_shift_days: run the worker's clock this many days ahead (libfaketime, when installed).
        random_seed: seed the worker's global ``random`` before the module is imported.
        limits: :class:`SandboxLimits`.
        sandbox: ``"auto"`` (bubblewrap, refusing without it unless unsandboxed is asked for) or ``"none"``
            (explicitly unsandboxed: a plain subprocess).
        generated: the module is generated code: running it unsandboxed also needs ``TRACE_UNSANDBOXED_GENERATED``.
        strict: raise :class:`WorkerError` out of ``reset``/``step`` when the worker fails, instead of ending
            the episode with ``env_error`` (admission: a check stops at the first failure).
    """

    env_id: str
    module: str
    cls: str
    module_root: str
    bind: str
    hash_seed: int = 0
    clock_shift_days: int = 0
    random_seed: int | None = None
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    sandbox: str = "auto"
    strict: bool = False
    generated: bool = False

    def __post_init__(self) -> None:
        if self.sandbox not in ("auto", "none"):
            raise ValueError(f"sandbox must be 'auto' or 'none', got {self.sandbox!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerSpec":
        data = dict(data)
        limits = data.pop("limits", None) or {}
        return cls(**data, limits=limits if isinstance(limits, SandboxLimits) else SandboxLimits(**limits))


# ------------------------------------------------------------------------------------------------ sandbox
_BWRAP_OK: dict[str, tuple[bool, str]] = {}


def bwrap_status() -> tuple[bool, str]:
    """(usable, why not): whether ``bwrap`` is installed and can create the namespaces the worker needs."""
    path = shutil.which("bwrap")
    if not path:
        return False, "bubblewrap (bwrap) is not installed; install it with `apt-get install -y bubblewrap`"
    if path not in _BWRAP_OK:
        try:
            proc = subprocess.run([path, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                                   *_usr_merge(), "--proc", "/proc", "--dev", "/dev", "true"],
                                  capture_output=True, timeout=20)
            ok, why = proc.returncode == 0, proc.stderr.decode(errors="replace").strip()[:300]
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        _BWRAP_OK[path] = (ok, "" if ok else f"bubblewrap cannot create its namespaces here ({why})")
    return _BWRAP_OK[path]


def unsandboxed_requested(explicit: bool | None = None) -> bool:
    """Whether the user asked to run sandboxed envs without bubblewrap (argument, else ``TRACE_UNSANDBOXED``)."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def generated_unsandboxed_allowed() -> bool:
    """Whether the user gave the second switch that lets *generated* code run without bubblewrap."""
    return os.environ.get(UNSANDBOXED_GENERATED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def refuse_unsandboxed_generated(env_id: str, why: str) -> str | None:
    """Why a generated env may not run unsandboxed now (None when both switches were given)."""
    if generated_unsandboxed_allowed():
        return None
    return (f"{env_id} is generated code and {why}. {UNSANDBOXED_ENV}=1 (--unsandboxed) alone does not run generated "
            f"code unsandboxed: set also {UNSANDBOXED_GENERATED_ENV}=1 (--unsandboxed-generated), knowing that it "
            "then runs as you and can read your files, the network and your other processes' environments; or "
            "install bubblewrap (`apt-get install -y bubblewrap`)")


def quarantined(spec: WorkerSpec) -> str | None:
    """Why ``spec``'s env may not start: its workspace (the folder its module imports from) quarantined it
    (``quarantine.json``, written by the use-time audit, :mod:`generators.audit`); None when it is not."""
    import json

    path = Path(spec.module_root or ".") / "quarantine.json"
    if not spec.module_root or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{spec.env_id}: its workspace's quarantine file {path} cannot be read; fix or remove it"
    if isinstance(data, dict) and spec.env_id in data:
        reason = data[spec.env_id].get("reason", "") if isinstance(data[spec.env_id], dict) else ""
        return (f"{spec.env_id} is quarantined ({path}): {str(reason)[:500]}. Remove its entry from that file only "
                "once the module has been read and fixed (better: generate it again)")
    return None


def faketime_library() -> str | None:
    """libfaketime's path when the ``faketime`` package is installed (used to shift a worker's clock)."""
    return next((p for p in _FAKETIME_LIBS if os.path.exists(p)), None)


def _usr_merge() -> list[str]:
    """``/bin``, ``/lib``, ... as on the host: symlinks into ``/usr`` on a merged-usr system, else read-only binds."""
    out: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            out += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            out += ["--ro-bind", str(host), str(host)]
    return out


def _code_paths() -> list[str]:
    """Read-only paths the interpreter needs: its installation, the virtual environment and its packages."""
    import site
    import sysconfig

    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        wanted.add(sysconfig.get_paths().get(key, ""))
    try:
        wanted.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover - some virtualenv builds
        pass
    exe = Path(sys.executable)
    wanted.add(str(exe.parent))
    wanted.add(str(exe.resolve().parent.parent))
    out: list[Path] = []
    for raw in sorted(wanted, key=len):
        if not raw or not os.path.exists(raw):
            continue
        path = Path(raw).resolve()
        if path == Path("/") or path.is_relative_to("/usr") or any(path.is_relative_to(p) for p in out):
            continue
        out.append(path)
    return [str(p) for p in out]


def _cache_root() -> Path:
    return Path(os.environ.get("TRACE_CACHE") or Path.home() / ".cache" / "trace")


def _shared_caches() -> list[tuple[str, str]]:
    """(host path, path in the worker) of the caches a worker reads, read-only: the SWE repositories (the
    trusted process fetched them; the worker has no network) and the parsed-registry cache (start-up speed)."""
    out = []
    swe = Path(os.environ.get("TRACE_SWE_CACHE") or _cache_root() / "swe")
    if swe.is_dir():
        out.append((str(swe.resolve()), str(swe.resolve())))
    registry_cache = _cache_root() / "registry"
    if registry_cache.is_dir():
        out.append((str(registry_cache.resolve()), "/tmp/.cache/registry"))
    return out


def _scrubbed_env(spec: WorkerSpec, home: str, faketime: str | None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "PYTHONPATH": str(_TRACE_ENVS.parent), "PYTHONHASHSEED": str(int(spec.hash_seed)),
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1", "TRACE_REGISTRY": "", "TRACE_CACHE": os.path.join(home, ".cache"),
    }
    swe = Path(os.environ.get("TRACE_SWE_CACHE") or _cache_root() / "swe")
    if swe.is_dir():
        env["TRACE_SWE_CACHE"] = str(swe.resolve())
    if spec.clock_shift_days and faketime:
        env.update({"LD_PRELOAD": faketime, "FAKETIME": f"{int(spec.clock_shift_days):+d}d"})
    return env


#: Where the env module's file appears inside the sandbox, whichever folder it lives in on the host (a
#: workspace's ``envs/``, admission's staging folder): the module cannot tell admission from use by its path.
SANDBOX_MODULE_ROOT = "/trace/env"


def _module_file(spec: WorkerSpec) -> Path | None:
    """The host file of the env module (``<module_root>/<a/b>.py``), when it is a plain file under its root."""
    if not spec.module_root or not spec.module:
        return None
    path = Path(spec.module_root) / (spec.module.replace(".", "/") + ".py")
    return path.resolve() if path.is_file() else None


def _bwrap_command(spec: WorkerSpec, env: dict[str, str], fds: tuple[int, int]) -> tuple[list[str], list[str], str]:
    """(bubblewrap's options, the command, the module root inside the sandbox). The options are handed to
    bubblewrap through ``--args FD``, so the sandbox's ``/proc/1/cmdline`` shows no host path, no seed and no
    limit: a worker of admission and one of later use look the same from inside."""
    cmd = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr",
           *_usr_merge()]
    if os.path.exists("/etc/ld.so.cache"):
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # The scratch tmpfs first: binds of paths under /tmp (a CI checkout, pytest's folders) go on top of it. It
    # has a size (host shared memory, outside RLIMIT_AS); /dev's own tmpfs is made read-only (its device nodes
    # still work), and so is bubblewrap's root tmpfs once every mount point is made (below).
    cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(int(spec.limits.tmpfs_mb) * 1024 * 1024), "--tmpfs", "/tmp"]
    for path in _code_paths():
        cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind", str(_TRACE_ENVS), str(_TRACE_ENVS)]
    module_file, root = _module_file(spec), spec.module_root
    if module_file is not None and not module_file.is_relative_to(_TRACE_ENVS):
        # Only the module's own file, at a fixed path (not its folder: a workspace's envs/ also holds other
        # modules and the admission reports, which a staged candidate's folder does not).
        root = SANDBOX_MODULE_ROOT
        cmd += ["--ro-bind", str(module_file), f"{root}/{spec.module.replace('.', '/')}.py"]
    elif spec.bind and not Path(spec.bind).resolve().is_relative_to(_TRACE_ENVS):
        cmd += ["--ro-bind", spec.bind, spec.bind]
    for host, inside in _shared_caches():
        cmd += ["--ro-bind", host, inside]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd, [sys.executable, "-B", "-m", "trace_envs.core.sandbox_worker", str(fds[0]), str(fds[1])], root


def _own_processes() -> int:
    """How many processes this user runs (RLIMIT_NPROC counts them all, not only the worker's)."""
    uid, n = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                n += entry.stat().st_uid == uid
            except OSError:
                pass
    return n


def _limit_fn(limits: SandboxLimits):
    import resource

    # The kernel does not apply RLIMIT_NPROC to root; for anyone else it counts every process of the
    # user, so the worker gets its share on top of what already runs.
    nproc = limits.nproc + (_own_processes() if os.getuid() != 0 else 0)

    def apply() -> None:
        for which, value in ((resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024), (resource.RLIMIT_CPU, limits.cpu_s),
                             (resource.RLIMIT_FSIZE, limits.file_mb * 1024 * 1024),
                             (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CORE, 0)):
            # CPU: SIGXCPU at the soft limit names the cause; the hard one, a second later, kills regardless.
            hard = value + 1 if which == resource.RLIMIT_CPU else value
            try:
                resource.setrlimit(which, (value, hard))
            except (ValueError, OSError):  # e.g. a hard limit already lower
                pass
    return apply


_LIVE: "weakref.WeakSet[WorkerProcess]" = weakref.WeakSet()


@atexit.register
def _kill_all() -> None:
    for worker in list(_LIVE):
        worker.kill()


class WorkerProcess:
    """One worker: started in the sandbox, spoken to over two pipes, killed with everything it started."""

    def __init__(self, spec: WorkerSpec, *, unsandboxed: bool = False):
        self.spec, self.unsandboxed = spec, unsandboxed
        self.limits = spec.limits
        self._next_id = 1
        self._buffer = b""
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self._scratch: str | None = None
        self.error: str | None = None
        faketime = faketime_library()
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        args_r = None
        self.module_root = spec.module_root  # as the worker's sys.path names it
        try:
            if unsandboxed:
                self._scratch = tempfile.mkdtemp(prefix="trace-worker-")
                env = _scrubbed_env(spec, self._scratch, faketime)
                cmd = [sys.executable, "-B", "-m", "trace_envs.core.sandbox_worker", str(req_r), str(resp_w)]
                cwd = self._scratch
            else:
                env = _scrubbed_env(spec, "/tmp", faketime)
                options, command, self.module_root = _bwrap_command(spec, env, (req_r, resp_w))
                args_r, args_w = os.pipe()
                with os.fdopen(args_w, "wb") as fh:  # a few KB: fits the pipe before bubblewrap reads it
                    fh.write(b"".join(o.encode() + b"\0" for o in options))
                cmd = [shutil.which("bwrap") or "bwrap", "--args", str(args_r), *command]
                cwd = "/"
                env = {"PATH": env["PATH"]}  # bwrap's own environment; the worker's is set by --setenv
            fds = (req_r, resp_w) if args_r is None else (req_r, resp_w, args_r)
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=env, cwd=cwd, pass_fds=fds,
                                         preexec_fn=_limit_fn(self.limits), start_new_session=True)
        finally:
            os.close(req_r)
            os.close(resp_w)
            if args_r is not None:
                os.close(args_r)
        self._w, self._r = req_w, resp_r
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        _LIVE.add(self)
        self._drainer = threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True)
        self._drainer.start()

    # ---------------------------------------------------------------- output (untrusted, kept apart)
    def _drain(self, stream) -> None:
        try:
            for chunk in iter(lambda: stream.read1(4096), b""):
                self._tail.append(chunk)
                self._tail_len += len(chunk)
                while self._tail_len > _OUTPUT_TAIL_BYTES and len(self._tail) > 1:
                    self._tail_len -= len(self._tail.popleft())
        except (OSError, ValueError):
            pass

    def output_tail(self) -> str:
        """The last few KB the module printed (stdout and stderr): untrusted text, never parsed."""
        if self.proc.poll() is not None:
            self._drainer.join(timeout=1.0)  # a dead worker's last words are still in the pipe
        data = b"".join(self._tail)[-_OUTPUT_TAIL_BYTES:]
        return data.decode("utf-8", "replace")

    # ---------------------------------------------------------------- calls
    def alive(self) -> bool:
        return self.error is None and self.proc.poll() is None

    def call(self, op: str, timeout: float | None = None, **fields: Any) -> dict:
        """Send one request and wait for its reply; :class:`WorkerError` when the worker fails."""
        if self.error is not None:
            raise WorkerError(self.error)
        msg_id = self._next_id
        self._next_id += 1
        limit = self.limits.call_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            data = wire.encode(wire.request(msg_id, op, **fields))
        except wire.WireError as exc:
            raise WorkerError(f"the request could not be sent: {exc}") from None
        try:
            self._send(data, deadline, op, limit)
            while True:
                message = wire.decode(self._line(deadline, op, limit))
                if message.get("id") == msg_id:
                    break
                if message.get("id") == -1 and not message.get("ok", True):
                    raise wire.WireError(str(message.get("error"))[:500])
        except wire.WireError as exc:
            self._fail(f"the worker broke the protocol during {op!r}: {exc}")
        if not message.get("ok"):
            return {"__error__": str(message.get("error") or "unknown error")}
        result = message.get("result")
        if not isinstance(result, dict):
            self._fail(f"the worker's reply to {op!r} has no result object")
        return result

    def _send(self, data: bytes, deadline: float, op: str, limit: float) -> None:
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"timed out after {limit:g} s while sending {op!r} (the worker stopped reading)")
            _, writable, _ = select.select([], [self._w], [], left)
            if not writable:
                continue
            try:
                n = os.write(self._w, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                self._fail(self._death(op))
            view = view[n:]

    def _line(self, deadline: float, op: str, limit: float) -> bytes:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"timed out after {limit:g} s during {op!r} (an endless loop, or a step too slow "
                           "for the per-call limit)")
            readable, _, _ = select.select([self._r], [], [], left)
            if not readable:
                continue
            try:
                chunk = os.read(self._r, 1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._fail(self._death(op))
            self._buffer += chunk
            if len(self._buffer) > wire.MAX_MESSAGE_BYTES:
                self._fail(f"the worker's reply to {op!r} exceeds {wire.MAX_MESSAGE_BYTES:,} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _death(self, op: str) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code > 128 and not self.unsandboxed:
            code = 128 - code  # bubblewrap exits with 128 + the signal that ended the worker
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = {signal.SIGKILL: " (killed: past a limit, e.g. memory)", signal.SIGXCPU: " (its CPU-time limit)",
                    signal.SIGXFSZ: " (its file-size limit)", signal.SIGSEGV: " (likely past its memory limit)"}
            return f"the worker died of {name}{hint.get(-code, '')} during {op!r}"
        return f"the worker exited with status {code} during {op!r}"

    def _fail(self, reason: str):
        self.error = reason
        self.kill()
        raise WorkerError(reason)

    def kill(self) -> None:
        """Kill the worker and, with it, its pid namespace (bubblewrap's init takes every process along)."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None and not self.unsandboxed:
            # Kill the pid namespace's init first: the kernel then kills every process in the namespace
            # and reaps them before init is gone, and bubblewrap exits once init has; so when wait()
            # returns, nothing the module started is left (a SIGKILL of bubblewrap alone would leave
            # that teardown to happen after we return).
            try:
                inits = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            except (OSError, ValueError):
                inits = []
            for pid in inits:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if inits:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        if proc is not None and proc.poll() is None:
            for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
                try:
                    target()
                    break
                except (ProcessLookupError, PermissionError, OSError):
                    continue
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a kernel that does not reap
                pass
        for fd in ("_w", "_r"):
            value = getattr(self, fd, None)
            if value is not None:
                try:
                    os.close(value)
                except OSError:
                    pass
                setattr(self, fd, None)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        if _LIVE is not None:  # None when an env left open is collected at interpreter shutdown
            _LIVE.discard(self)

    def close(self, timeout: float = 5.0) -> None:
        """Ask the env to close (its own cleanup), then kill the worker in any case."""
        if self.alive():
            try:
                self.call("close", timeout=timeout)
            except WorkerError:
                pass
        self.kill()


# ------------------------------------------------------------------------------------------------ the class, described
_DESCRIBED: dict[tuple[str, str, str], type] = {}
_DESCRIBE_BOUND = 2000  # characters of a worker-given hint_text kept (registry.HINT_BOUND)


def stand_in_class(entry: Any) -> type:
    """A :class:`SandboxedEnv` subclass standing in for a sandboxed entry's env class, for callers that
    inspect classes (``hint_text``, the constructor's keyword arguments): read from one worker that is
    started for it (once per id), so the module is still never imported here."""
    key = (entry.id, entry.source, entry.entry_point)
    if key in _DESCRIBED:
        return _DESCRIBED[key]
    import inspect

    from .registry import worker_spec

    env = SandboxedEnv(trace_worker=worker_spec(entry).to_dict(), **dict(entry.kwargs))
    try:
        desc = env._worker.call("describe") if env._worker is not None else {}
    except WorkerError:
        desc = {}
    finally:
        env.close()
    names = [str(n) for n in desc.get("init_params") or [] if isinstance(n, str) and n.isidentifier()]
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in names]
    if desc.get("var_keyword"):
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))

    def __init__(self, **kwargs):  # noqa: N807 - what gym.make calls; the signature is the env's own
        SandboxedEnv.__init__(self, trace_env_id=entry.id, **kwargs)

    __init__.__signature__ = inspect.Signature(params)
    # What the worker says is untrusted data: bounded here. A generated module's hint_text is kept (as data,
    # for display) but never becomes a prompt: registry.prompt_hint ignores it.
    hint = desc.get("hint_text")
    hint = hint[:_DESCRIBE_BOUND] if isinstance(hint, str) else None
    name = desc.get("name") if isinstance(desc.get("name"), str) and desc["name"].isidentifier() else "SandboxedEnv"
    cls = type(name[:100], (SandboxedEnv,), {"__init__": __init__, "hint_text": hint,
                                             "__doc__": str(desc.get("doc") or SandboxedEnv.__doc__)[:4000],
                                             "__module__": __name__})
    _DESCRIBED[key] = cls
    return cls


# ------------------------------------------------------------------------------------------------ output capture
_COLLECTORS: list[list] = []


class collect_output:
    """Context manager: (env id, output tail, error or None) of every worker that ends inside it (closed or
    failed), for an admission report."""

    def __enter__(self) -> list[tuple[str, str, str | None]]:
        self.items: list[tuple[str, str, str | None]] = []
        _COLLECTORS.append(self.items)
        return self.items

    def __exit__(self, *exc) -> None:
        _COLLECTORS.remove(self.items)


# ------------------------------------------------------------------------------------------------ the proxy env
class _RemotePolicy:
    """A scripted policy that lives in the worker; each call asks it for its action in the current state."""

    def __init__(self, env: "SandboxedEnv", handle: int | None, error: str | None = None):
        self.env, self.handle, self.error = env, handle, error

    def __call__(self, observation: str, info: dict) -> Any:
        if self.handle is None:
            return ""  # the worker could not build the policy: an empty turn (the episode scores what it scores)
        result = self.env._call("act", handle=self.handle)
        if result is None or "__error__" in result:
            return ""
        return wire.unpack(result.get("action"))


class _ToolSpecView:
    def __init__(self, defaults: dict):
        self.defaults = defaults


class _ToolsetView:
    """What callers ask of ``env._toolset``: which tools write (the worker's answer, or a trusted one) and
    each tool's argument defaults (``specs[name].defaults``, as the TRL adapter reads them)."""

    def __init__(self, env: "SandboxedEnv", writes: set[str]):
        self._env, self.names = env, writes

    def is_write(self, name: str) -> bool:
        return name in self.names

    @property
    def specs(self) -> dict:
        value = self._env._query("tool_defaults")
        if not isinstance(value, dict):
            return {}
        return {str(k): _ToolSpecView(dict(v) if isinstance(v, dict) else {}) for k, v in value.items()}


class SandboxedEnv(gym.Env):
    """A TraceEnv-compatible proxy whose env runs in a sandboxed worker process.

    Made by ``gym.make`` for sandboxed registry entries (``trace_env_id``), or directly from a
    :class:`WorkerSpec` (``trace_worker``, as admission does). ``trace_limits`` overrides fields of
    :class:`SandboxLimits` (e.g. ``{"call_timeout_s": 10}``); ``trace_unsandboxed=True`` lets it run
    without bubblewrap. Other keyword arguments go to the env's constructor in the worker. Spaces,
    ``reset``/``step``/``close``, seeding and ``info`` are the env's own; the transcript (``messages``),
    ``tools``, ``task_info()``, ``task_spec()``, ``task_fingerprint()``,
    ``oracle()`` (a policy that runs in the worker) and ``open_resources()`` are available here too.
    """

    sandboxed = True
    hint_text = None

    def __init__(self, trace_env_id: str | None = None, trace_worker: dict | None = None,
                 trace_unsandboxed: bool | None = None, trace_limits: dict | None = None,
                 render_mode: str | None = None, **kwargs: Any):
        if trace_worker is None:
            if trace_env_id is None:
                raise TypeError("SandboxedEnv needs trace_env_id (a registered id) or trace_worker (a WorkerSpec)")
            from .registry import get_entry, worker_spec

            trace_worker = worker_spec(get_entry(trace_env_id)).to_dict()
        if trace_limits:
            trace_worker = {**trace_worker, "limits": {**asdict(WorkerSpec.from_dict(trace_worker).limits),
                                                       **trace_limits}}
        self.spec_worker = WorkerSpec.from_dict(trace_worker)
        why_quarantined = quarantined(self.spec_worker)
        if why_quarantined:
            raise SandboxUnavailable(why_quarantined)
        self.env_kwargs = dict(kwargs)
        self.render_mode = render_mode
        ok, why = bwrap_status()
        if self.spec_worker.sandbox == "none":
            ok, why, trace_unsandboxed = False, "running unsandboxed was asked for", True
        self.unsandboxed = not ok
        if not ok:
            if not unsandboxed_requested(trace_unsandboxed):
                raise SandboxUnavailable(
                    f"{self.spec_worker.env_id} runs only in a sandbox, and {why}. To run it anyway, without "
                    f"file-system and network isolation, pass --unsandboxed (CLI), set {UNSANDBOXED_ENV}=1, or "
                    "pass trace_unsandboxed=True to gym.make")
            refusal = refuse_unsandboxed_generated(self.spec_worker.env_id, why) if self.spec_worker.generated else None
            if refusal:
                raise SandboxUnavailable(refusal)
            warnings.warn(f"{self.spec_worker.env_id}: running a generated env WITHOUT a sandbox ({why}); it can "
                          "read your files and reach the network", RuntimeWarning, stacklevel=2)
        self.trusted_write_tools: set[str] | None = None
        self.worker_error: str | None = None
        self._worker: WorkerProcess | None = None
        self._receiver = wire.InfoReceiver()
        self._failed: str | None = None
        self._seed: int | None = None
        self._task_info: dict = {}
        self._last_info: dict = {"messages": [], "tools": []}
        self._write_tools: set[str] | None = None
        spaces = self._start()
        self.observation_space = wire.space_from_wire(spaces["observation_space"])
        self.action_space = wire.space_from_wire(spaces["action_space"])
        meta = spaces.get("metadata") if isinstance(spaces.get("metadata"), dict) else {}
        self.metadata = {"render_modes": list(meta.get("render_modes") or [])}

    # ---------------------------------------------------------------- worker
    def _start(self) -> dict:
        """Start a worker and build the env in it; raises :class:`WorkerError` if that fails."""
        self._worker = WorkerProcess(self.spec_worker, unsandboxed=self.unsandboxed)
        s = self.spec_worker
        try:
            result = self._worker.call("init", timeout=s.limits.start_timeout_s, module=s.module, cls=s.cls,
                                       module_root=self._worker.module_root, kwargs=wire.pack(self.env_kwargs),
                                       render_mode=self.render_mode, random_seed=s.random_seed)
        except WorkerError as exc:  # died before it could answer: what it printed is all there is to go on
            tail = self._worker.output_tail()
            self._collect(f"failed to start: {exc}")
            raise WorkerError(f"{s.env_id} failed to start: {exc}" +
                              (f"\n[untrusted output of the worker]\n{tail[-2000:]}" if tail.strip() else "")) from exc
        if "__error__" in result:
            tail = self._worker.output_tail()
            self._worker.kill()
            self._collect(f"failed to start: {result['__error__']}")
            raise WorkerError(f"{s.env_id} failed to start: {result['__error__']}" +
                              (f"\n[untrusted output of the module]\n{tail[-2000:]}" if tail.strip() else ""))
        return result

    def _call(self, op: str, **fields: Any) -> dict | None:
        """One call; None (and the episode failed) when the worker fails."""
        if self._failed or self._worker is None:
            return None
        try:
            return self._worker.call(op, **fields)
        except WorkerError as exc:
            self._fail(str(exc))
            return None

    def _fail(self, reason: str) -> None:
        self._failed = self.worker_error = reason
        if self._worker is not None:
            self._worker.kill()
            self._collect(reason)

    def _collect(self, error: str | None = None) -> None:
        if self._worker is not None and _COLLECTORS:
            _COLLECTORS[-1].append((self.spec_worker.env_id, self._worker.output_tail(), error))

    def _error_result(self, reason: str) -> tuple:
        info = {"messages": list(self._last_info.get("messages") or []), "tools": self._last_info.get("tools") or [],
                "reward": 0.0, "reward_breakdown": {"reason": "env_error", "error": reason}, "success": False,
                "termination": "env_error", "env_error": reason}
        first = reason.splitlines()[0] if reason else "unknown"
        obs = f"Error: the environment failed ({first[:300]}). The episode has ended."
        if self.observation_space.max_length < len(obs):
            obs = obs[: self.observation_space.max_length]
        return obs, 0.0, True, False, info

    # ---------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)  # the proxy's np_random follows the env's, as gymnasium's checker expects
        self._seed = seed
        self._write_tools = None
        self._receiver.clear()
        if self._failed or self._worker is None or not self._worker.alive():
            self._failed = None
            try:
                self._start()
            except WorkerError as exc:
                self._fail(str(exc))
        result = self._call("reset", seed=seed, options=wire.pack(options),
                            timeout=self.spec_worker.limits.call_timeout_s)
        if result is not None and "__error__" in result:
            self._fail(f"reset raised {result['__error__']}")
            result = None
        if result is None:
            self._raise_if_strict()
            obs, _, _, _, info = self._error_result(self._failed or "the worker failed")
            self._last_info = info
            return obs, info
        try:
            obs = self._observation(result.get("observation"))
            info = self._receiver.apply(result.get("info"))
            task = wire.unpack(result.get("task_info"))
        except wire.WireError as exc:
            self._fail(f"the worker broke the protocol in reset: {exc}")
            obs, _, _, _, info = self._error_result(self._failed)
            return obs, info
        self._task_info = task if isinstance(task, dict) else {}
        self._last_info = info
        self._follow_rng(result.get("rng"))
        return obs, info

    def step(self, action: Any):
        if self._failed:
            self._raise_if_strict()
            return self._error_result(self._failed)
        result = self._call("step", action=wire.pack(action))
        if result is not None and "__error__" in result:
            # An exception out of the env's step: in process it would reach the caller; here it ends the episode.
            self._fail(f"step raised {result['__error__']}")
            result = None
        if result is None:
            self._raise_if_strict()
            out = self._error_result(self._failed or "the worker failed")
            self._last_info = out[4]
            return out
        try:
            obs = self._observation(result.get("observation"))
            reward, terminated, truncated = result.get("reward"), result.get("terminated"), result.get("truncated")
            if not (isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)):
                raise wire.WireError(f"reward {reward!r} is not a finite number")
            if not (isinstance(terminated, bool) and isinstance(truncated, bool)):
                raise wire.WireError("terminated and truncated must be booleans")
            info = self._receiver.apply(result.get("info"))
        except wire.WireError as exc:
            self._fail(f"the worker broke the protocol in step: {exc}")
            return self._error_result(self._failed)
        self._last_info = info
        self._follow_rng(result.get("rng"))
        return obs, float(reward), terminated, truncated, info

    def _raise_if_strict(self) -> None:
        if self.spec_worker.strict and self._failed:
            raise WorkerError(self._failed)

    _BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")

    def _follow_rng(self, state: Any) -> None:
        """Set this proxy's ``np_random`` to the env's state (a malformed state is ignored: it is only a mirror)."""
        if not (isinstance(state, dict) and state.get("bit_generator") in self._BIT_GENERATORS):
            return
        import numpy as np

        try:
            rng = self._np_random
            if rng is None or type(rng.bit_generator).__name__ != state["bit_generator"]:
                rng = np.random.Generator(getattr(np.random, state["bit_generator"])())
            rng.bit_generator.state = state
            self._np_random = rng
        except (TypeError, ValueError, KeyError, AttributeError):
            pass

    @staticmethod
    def _observation(value: Any) -> str:
        if not isinstance(value, str):
            raise wire.WireError(f"an observation must be a string, got {type(value).__name__}")
        return value

    def render(self):
        result = self._call("query", what="render")
        return None if result is None or "__error__" in result else result.get("value")

    def close(self) -> None:
        if self._worker is not None:
            self._collect()
            self._worker.close()
        self._worker = None  # a reset after close starts a fresh worker, as a TraceEnv allows
        self._failed = None

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.kill()

    # ---------------------------------------------------------------- what TraceEnv offers agents and checks
    @property
    def messages(self) -> list[dict]:
        return list(self._last_info.get("messages") or [])

    @property
    def tools(self) -> list[dict]:
        return self._last_info.get("tools") or []

    @property
    def termination(self) -> str | None:
        return self._last_info.get("termination")

    def task_info(self) -> dict:
        return dict(self._task_info)

    def task_fingerprint(self) -> str:
        result = self._call("query", what="task_fingerprint")
        if result is None or "__error__" in result:
            return f"env_error:{self._failed or (result or {}).get('__error__', '')[:200]}"
        return str(result.get("value"))

    def remote_policy(self, kind: str, args: dict | None = None) -> _RemotePolicy:
        """A scripted policy built in the worker for this episode (``oracle``, ``tau_scripted``, ``agent``)."""
        if kind not in wire.POLICY_KINDS:
            raise ValueError(f"unknown policy kind {kind!r}; known: {', '.join(wire.POLICY_KINDS)}")
        result = self._call("policy", kind=kind, args=wire.pack(args or {}))
        if result is None or "__error__" in result:
            return _RemotePolicy(self, None, (result or {}).get("__error__", self._failed))
        return _RemotePolicy(self, result.get("handle"))

    def oracle(self) -> _RemotePolicy:
        """The env's oracle, which lives in the worker: each call returns its action for the current state."""
        return self.remote_policy("oracle")

    def _query(self, what: str) -> Any:
        result = self._call("query", what=what)
        if result is None or "__error__" in result:
            return None
        try:
            return wire.unpack(result.get("value"))
        except wire.WireError:
            return None

    def task_spec(self) -> dict:
        value = self._query("task_spec")
        return value if isinstance(value, dict) else {}

    @property
    def _toolset(self) -> _ToolsetView:
        if self.trusted_write_tools is not None:
            return _ToolsetView(self, set(self.trusted_write_tools))
        if self._write_tools is None:
            value = self._query("write_tools")
            self._write_tools = {str(v) for v in value} if isinstance(value, list) else set()
        return _ToolsetView(self, self._write_tools)

    def open_resources(self) -> list[str]:
        """What is still open: the worker process while it runs (after ``close()``, nothing)."""
        if self._worker is not None and self._worker.proc.poll() is None:
            return [f"sandbox worker pid {self._worker.proc.pid}"]
        return []

    def output_tail(self) -> str:
        """The module's latest printed output (untrusted)."""
        return self._worker.output_tail() if self._worker is not None else ""

    @property
    def worker_pid(self) -> int | None:
        return self._worker.proc.pid if self._worker is not None else None
