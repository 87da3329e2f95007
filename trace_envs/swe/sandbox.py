"""Sandboxes that run an agent's commands against a repository.

``DockerSandbox`` is the default: one container per episode from the
repository's image (see :mod:`trace_envs.swe.images`), started with no
network, every capability dropped, ``no-new-privileges``, a read-only root
filesystem and memory, CPU and pid limits. Commands go through one persistent
``bash`` attached over the Docker API (a round trip costs well under a
millisecond instead of ~60 ms per ``docker exec``). Files are streamed in as tar archives.

What an agent's command can and cannot do to the sandbox (each point is tested in
``tests/test_swe_sandbox_limits.py`` and ``tests/test_swe_adversarial.py``):

* **Its own process group and time budget.** Each command runs under coreutils
  ``timeout`` (its own process group, killed as a group at the deadline). Its output goes
  to a file, not a pipe, so the command returns when *it* exits, not when every process that
  inherited its stdout has closed it.
* **No process outlives its command.** The container's init and main process run as root
  (without capabilities); the persistent shell and every command run as uid 1000. When a
  command returns, the shell sends ``kill -9 -1``: every other process of uid 1000 — a
  daemon, a fork bomb, a watcher rewriting files — is gone before the next command (the kernel
  delivers it to all of them at once, and the sweep repeats until nobody is left, so a fork bomb
  cannot outrun it). Before grading,
  :meth:`DockerSandbox.kill_user_processes` does the same from a fresh ``docker exec``, waits
  until no process of the agent is left, and opens a new shell.
* **Limits it can see.** A cgroup OOM kill is reported as ``killed: out of memory (limit N MB)``
  (the memory cgroup's ``oom_kill`` counter, read before and after), a time-out as a time-out.
  The root filesystem is read-only; the writable places are tmpfs mounts with a size — the
  repository (``/testbed``), ``/tmp`` and ``/dev/shm`` — so a runaway write stops at its budget
  (``--storage-opt size=`` does not work on overlay2 over extfs, docs/design.md, "Sandboxing") and the command's
  output says ``disk budget exhausted: /tmp is full (512 MB)``. tmpfs pages count against the
  memory limit, which is why the budgets are well below it.
* **The harness's own files are out of reach.** Command output and the pytest report live in
  ``/run/trace``, a tmpfs owned by root whose two files root creates (mode 666) at start:
  the agent can write their content but cannot replace them with a FIFO or a symlink.

Every container carries the label ``org.trace.run`` (set at ``docker run``, so a container
someone else starts from a TRACE image never has it) with the owner's pid and that process's
start time; it is removed on ``close()``, at interpreter exit (``atexit``), on SIGTERM, SIGINT and
SIGHUP (chained in front of the handlers that were there: :func:`install_signal_cleanup`), and by
``trace swe cleanup`` (:func:`cleanup_containers`; ``--only-dead`` only when the owner process is
gone or its pid now names another process). As a last resort the container's main process is
``sleep MAX_LIFETIME_S``, so a container whose owner was killed with SIGKILL exits by itself and
the engine removes it.

``LocalSandbox`` runs commands in a temporary directory with ``subprocess``
(inside ``bwrap`` with no network when bubblewrap is installed). It offers no
real isolation and says so with a warning; it exists for machines without
Docker and must be chosen explicitly.

The docker package is imported only when a ``DockerSandbox`` is created.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import io
import logging
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..core.bwrap import rebind_hidden
from .images import IMAGE_LAYOUT, LABEL, docker_client

logger = logging.getLogger(__name__)

WORKDIR = "/testbed"
#: Set at ``docker run`` on every container TRACE starts: ``<owner pid>:<owner start time>``.
RUN_LABEL = "org.trace.run"
#: The harness's tmpfs (root-owned) and the two files in it the shell and the pytest plugin write.
HARNESS_DIR = "/run/trace"
OUTPUT_FILE = f"{HARNESS_DIR}/out"
REPORT_FILE = f"{HARNESS_DIR}/report.json"
#: The agent's writable places (tmpfs, each with a size): checked after every command for a full disk.
WRITABLE_MOUNTS = (WORKDIR, "/tmp", "/dev/shm")
#: The uid:gid the grader's test run uses: it can read the agent's repository but not write it.
GRADER_USER = "1001:1001"
#: A container whose owner vanished exits after this many seconds (and is auto-removed).
MAX_LIFETIME_S = 3 * 3600
DEFAULT_OUTPUT_CAP = 20_000


class SandboxError(RuntimeError):
    """The sandbox itself failed (container gone, shell died, engine unreachable) — not the agent's command."""


class ShellExited(SandboxError):
    """The persistent shell ended (a command may have killed it); the container may still be running."""


class SandboxWriteError(RuntimeError):
    """Files could not be written although the sandbox works (e.g. the agent made a directory read-only)."""


@dataclass
class CommandResult:
    """What one command produced. ``output`` is stdout and stderr interleaved, capped (its start and its end
    are kept when it is longer than the cap), followed by a bracketed note for a time-out, an out-of-memory
    kill or a full disk budget."""

    exit_code: int
    output: str
    timed_out: bool = False
    seconds: float = 0.0
    truncated: bool = False
    #: the memory cgroup killed a process of this command
    oom_killed: bool = False
    #: writable mounts that were full when the command returned
    disk_full: tuple[str, ...] = ()
    #: a fork failed because the container's process limit was reached
    pids_limited: bool = False
    #: wall time of the command itself, measured inside the sandbox (``seconds`` minus this: the harness's cost)
    inner_seconds: float | None = None
    #: the bracketed notes at the end of ``output`` (time-out, out of memory, process limit, full disk)
    notes: tuple[str, ...] = ()
    #: the content of the ``also_read`` file, read once the command's processes were gone
    extra: str | None = None

    @property
    def body(self) -> str:
        """``output`` without the notes."""
        tail = "\n".join(self.notes)
        if tail and self.output.endswith(tail):
            return self.output[: -len(tail)].rstrip("\n")
        return self.output


@dataclass(frozen=True)
class Harness:
    """Where a sandbox keeps what the grader runs (see :mod:`trace_envs.swe.sandbox_pytest` / ``sandbox_tree``).

    Attributes:
        python: the interpreter that runs the tests.
        plugin: the report plugin's file.
        pytest_runner: the pytest launcher's file.
        tree_tool: the tree restorer's file.
        trusted: directories of installed dependencies (on ``sys.path`` before the repository).
        report: the file the report plugin writes.
        clean: the clean repository tree (read-only).
        wipe: scratch directories emptied before grading.
        path: ``PATH`` of the test process.
    """

    python: str
    plugin: str
    pytest_runner: str
    tree_tool: str
    trusted: tuple[str, ...]
    report: str
    clean: str
    wipe: tuple[str, ...] = ()
    path: str = "/usr/local/bin:/usr/bin:/bin"


DOCKER_HARNESS = Harness(python="python3", plugin=IMAGE_LAYOUT["plugin"], pytest_runner=IMAGE_LAYOUT["pytest_runner"],
                         tree_tool=IMAGE_LAYOUT["tree_tool"], trusted=(IMAGE_LAYOUT["deps"],), report=REPORT_FILE,
                         clean=IMAGE_LAYOUT["clean"], wipe=("/tmp", "/dev/shm"))


@dataclass
class SandboxLimits:
    """Resource limits of one container.

    Attributes:
        memory: memory limit (docker syntax, e.g. "2g"); swap is disabled by setting memswap to the same.
        cpus: CPU quota in cores.
        pids: maximum number of processes (a fork bomb stops here).
        nofile: open-file limit.
        user: uid:gid the commands run as (not root; the container's init runs as root without capabilities,
            out of the commands' reach).
        repo_disk: size of the repository's tmpfs (``/testbed``).
        tmp_disk: size of ``/tmp``.
        shm_disk: size of ``/dev/shm``.
    """

    memory: str = "2g"
    cpus: float = 1.0
    pids: int = 256
    nofile: int = 4096
    user: str = "1000:1000"
    repo_disk: str = "256m"
    tmp_disk: str = "512m"
    shm_disk: str = "64m"

    @property
    def memory_mb(self) -> int:
        return _size_mb(self.memory)


def _size_mb(size: str) -> int:
    """Docker's size syntax ("2g", "512m", "1048576") in MB."""
    text = str(size).strip().lower()
    units = {"k": 1 / 1024, "m": 1, "g": 1024}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(int(text) / (1024 * 1024))


def process_token(pid: int) -> str | None:
    """``pid:start_time`` of a live process (start time in clock ticks since boot), or None if it is gone.
    The start time tells a process apart from a later one that got the same pid."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid}:{stat_line.rpartition(')')[2].split()[19]}"


def _tar_bytes(files: dict[str, bytes | str], uid: int = 1000) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in sorted(files.items()):
            blob = data.encode("utf-8") if isinstance(data, str) else data
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(blob), 0o644, uid, uid, time.time()
            tar.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


class Sandbox:
    """The interface the SWE environments use: run a command, write files, close."""

    kind = "abstract"
    workdir = WORKDIR
    harness: Harness

    def kill_user_processes(self) -> None:
        """End every process the agent's commands started (the grader calls this before it trusts the tree)."""
        raise NotImplementedError

    def run(self, command: str, timeout: float = 60.0, max_output: int = DEFAULT_OUTPUT_CAP,
            also_read: str | None = None) -> CommandResult:
        raise NotImplementedError

    def run_as_grader(self, command: str, timeout: float = 300.0, max_output: int = DEFAULT_OUTPUT_CAP,
                      also_read: str | None = None) -> CommandResult:
        """Run the grader's command where the agent's code cannot write the repository (default: like ``run``)."""
        return self.run(command, timeout=timeout, max_output=max_output, also_read=also_read)

    def write_files(self, files: dict[str, bytes | str]) -> None:
        """Write files (paths relative to the repository root), creating directories as needed."""
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------------------------ Docker

_LIVE: dict[str, "DockerSandbox"] = {}
# Re-entrant: a signal handler runs on the main thread, possibly while that thread holds the lock.
_LIVE_LOCK = threading.RLock()


def _remove_container(client, container_id: str) -> None:
    import docker

    try:
        client.api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: removal already in progress (auto-remove)
            logger.warning("could not remove container %s: %s", container_id[:12], exc)


#: Threads inside ``containers.run`` (a container may exist that is not registered yet), and the exit flag.
_STARTING: list[int] = []
_STARTED = threading.Condition(_LIVE_LOCK)
_SHUTDOWN = {"now": False}


def _close_all_at_exit(final: bool = True) -> None:
    """Remove every container of this process. ``final``: no new sandbox may start afterwards, and starts in
    flight on other threads (a warm pool refilling) are waited for, so their containers get removed too."""
    with _LIVE_LOCK:
        if final:
            _SHUTDOWN["now"] = True
            me = threading.get_ident()
            deadline = time.monotonic() + 15
            while [t for t in _STARTING if t != me] and time.monotonic() < deadline:
                _STARTED.wait(max(0.0, deadline - time.monotonic()))
        # A forked child inherits _LIVE but must not remove its parent's containers.
        boxes = [box for box in _LIVE.values() if box.owner_pid == os.getpid()]
    for box in boxes:
        try:
            box.close()
            box._remove_now()  # also those whose removal was left to a background thread (close(wait=False))
        except Exception:  # best effort at interpreter exit
            pass


atexit.register(_close_all_at_exit)

#: Signals on which the containers of this process are removed before the previous handler runs.
CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PREVIOUS_HANDLERS: dict[int, object] = {}


def _on_signal(signum, frame) -> None:
    """Remove this process's containers, then do what the handler we replaced would have done."""
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    # Python's own SIGINT handler raises KeyboardInterrupt: a host may catch it and keep using its
    # environments, and if nobody does the interpreter exits through atexit, which removes them.
    if not (signum == signal.SIGINT and previous is signal.default_int_handler):
        # Final (no new sandboxes) only when the process is sure to die; a host handler may carry on.
        _close_all_at_exit(final=not callable(previous))
    if callable(previous):
        previous(signum, frame)  # the host's own handler (or Python's KeyboardInterrupt for SIGINT)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or a handler installed outside Python): die of the signal as if we had never been here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_signal_cleanup() -> bool:
    """Chain container cleanup in front of the current SIGTERM/SIGINT/SIGHUP handlers (idempotent).

    Called when the first sandbox or pool is created, not at import, so importing this module never
    changes a host program's handlers. Only the main thread may install handlers; elsewhere this is a
    no-op (``atexit`` and the containers' own lifetime limit still apply). A handler the host installs
    later replaces ours, which is the host's choice. Returns whether the handlers are installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return bool(_PREVIOUS_HANDLERS)
    for signum in CLEANUP_SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        if current == signal.SIG_IGN:  # e.g. SIGHUP under nohup: the host asked to ignore it, leave it alone
            continue
        _PREVIOUS_HANDLERS[signum] = current
        signal.signal(signum, _on_signal)
    return True


#: Wraps every container start (the ``docker run`` of :class:`DockerSandbox`): a no-argument factory of a context
#: manager, a no-op by default. The Ray rollout backend installs one on its actors that caps the container
#: starts of the whole cluster (:func:`set_start_gate`).
_START_GATE = {"gate": contextlib.nullcontext}


def set_start_gate(gate=None):
    """Install ``gate`` (a no-argument callable returning a context manager entered around each container
    start; None = no gate) and return the previous one."""
    previous = _START_GATE["gate"]
    _START_GATE["gate"] = gate or contextlib.nullcontext
    return previous


class DockerSandbox(Sandbox):
    """A locked-down container with a persistent shell in the repository root.

    Args:
        image: the repository image (``images.build_repo_image``).
        limits: resource limits.
        client: a docker SDK client (default: ``docker.from_env()``).
        labels: extra labels (the sandbox label and owner pid are always set).
    """

    kind = "docker"
    _MARK = "__TRACE_DONE_"

    def __init__(self, image: str, limits: SandboxLimits | None = None, client=None, labels: dict | None = None):
        self.image = image
        self.limits = limits or SandboxLimits()
        self.client = client or docker_client()
        self._lock = threading.Lock()
        self._sock = None
        self._buf = b""
        self.container_id: str | None = None
        self._closed = False
        self.owner_pid = os.getpid()
        install_signal_cleanup()
        all_labels = {LABEL: "1", "org.trace.pid": str(os.getpid()), **(labels or {}),
                      RUN_LABEL: process_token(os.getpid()) or f"{os.getpid()}:?"}
        lim = self.limits
        me = threading.get_ident()
        with _LIVE_LOCK:
            if _SHUTDOWN["now"]:
                raise SandboxError("not starting a sandbox: this process is shutting down")
            _STARTING.append(me)
        container = None
        try:
            uid, _, gid = lim.user.partition(":")
            # The main process (root, no capabilities) creates the harness's two files in its root-owned tmpfs,
            # then sleeps: commands (uid 1000) can neither kill it nor replace those files.
            main = (f"touch {OUTPUT_FILE} {REPORT_FILE} && chmod 666 {OUTPUT_FILE} {REPORT_FILE} && "
                    f"exec sleep {MAX_LIFETIME_S}")
            with _START_GATE["gate"]():
                container = self._run_container(image, main, lim, all_labels, uid, gid)
        except Exception as exc:
            raise SandboxError(f"could not start a container from {image}: {exc}") from exc
        finally:
            with _LIVE_LOCK:
                _STARTING.remove(me)
                if container is not None:
                    _LIVE[container.id] = self  # registered before anyone can see the exit cleanup as done
                _STARTED.notify_all()
        self.container_id = container.id
        if _SHUTDOWN["now"]:  # the exit cleanup ran while this container was starting (a pool thread)
            self.close()
            raise SandboxError("not starting a sandbox: this process is shutting down")
        try:
            self._open_shell()
            self._populate()
        except Exception:
            self.close()
            raise

    def _run_container(self, image: str, main: str, lim: SandboxLimits, all_labels: dict, uid: str, gid: str):
        """``docker run`` of the locked-down container (detached; its main process only sleeps)."""
        return self.client.containers.run(
            image, ["sh", "-c", main], detach=True, auto_remove=True, init=True,
            network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"], user="0:0",
            read_only=True, tmpfs={
                WORKDIR: f"rw,exec,nosuid,nodev,size={lim.repo_disk},mode=755,uid={uid},gid={gid or uid}",
                "/tmp": f"rw,exec,nosuid,nodev,size={lim.tmp_disk},mode=1777",
                HARNESS_DIR: "rw,noexec,nosuid,nodev,size=64m,mode=755"},
            shm_size=lim.shm_disk,
            mem_limit=lim.memory, memswap_limit=lim.memory, nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids, labels=all_labels, working_dir=WORKDIR,
            ulimits=[self._ulimit("nofile", lim.nofile)], name=f"trace-swe-{uuid.uuid4().hex[:12]}")

    harness = DOCKER_HARNESS

    def _populate(self) -> None:
        """Copy the clean tree from the image into the repository's tmpfs (a few ms for these repositories).

        The container's main process creates the harness's output file after the start; every wrapped
        command redirects into it, so the first one waits for it here, outside the wrapper (inside, the
        redirect has already failed: under load that read as an empty, failed copy)."""
        mark = f"{self._MARK}{uuid.uuid4().hex[:16]}"
        text = self._exchange(f"__i=0; while [ $__i -lt 3000 ] && ! [ -w {OUTPUT_FILE} ]; do sleep 0.01; "
                              f"__i=$((__i+1)); done; [ -w {OUTPUT_FILE} ]; echo {mark} $?\n", mark + " ", 60)
        if self._exit_code(text.rpartition(mark + " ")[2]) != 0:
            raise SandboxError(f"the sandbox's harness file {OUTPUT_FILE} was not created within 30 s of the start")
        res = self.run(f"cp -R --preserve=mode,timestamps,links {IMAGE_LAYOUT['clean']}/. {WORKDIR}/", timeout=60)
        if res.exit_code != 0:
            raise SandboxError(f"could not copy the repository into the sandbox: {res.output[-500:]}")

    @staticmethod
    def _ulimit(name: str, value: int):
        import docker

        return docker.types.Ulimit(name=name, soft=value, hard=value)

    def _open_shell(self) -> None:
        api = self.client.api
        exec_id = api.exec_create(self.container_id, ["bash", "--noprofile", "--norc"], stdin=True, stdout=True,
                                  stderr=True, tty=False, workdir=WORKDIR, user=self.limits.user)["Id"]
        sock = api.exec_start(exec_id, socket=True, tty=False)
        self._sock = getattr(sock, "_sock", sock)
        self._buf = b""
        # The shell's own diagnostics ("Killed" job notices, fork retries) are not the command's output.
        self._sock.sendall(b"exec 2>/dev/null\n")

    # -- the persistent shell's framing: docker multiplexes stdout/stderr in 8-byte-header frames
    def _read_frame(self, deadline: float) -> bytes:
        while True:
            if len(self._buf) >= 8:
                size = struct.unpack(">I", self._buf[4:8])[0]
                if len(self._buf) >= 8 + size:
                    payload, self._buf = self._buf[8:8 + size], self._buf[8 + size:]
                    return payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout as exc:
                raise TimeoutError from exc
            except OSError as exc:
                raise SandboxError(f"the sandbox shell connection broke ({exc})") from exc
            if not chunk:
                raise ShellExited("the sandbox shell exited (was the container stopped or killed?)")
            self._buf += chunk

    def _exchange(self, script: str, mark: str, read_timeout: float) -> str:
        """Send ``script`` to the persistent shell and read until the line ``mark <exit code>``; return all output."""
        if self._closed or self._sock is None:
            raise SandboxError("the sandbox is closed")
        with self._lock:
            try:
                self._sock.sendall(script.encode("utf-8"))
            except OSError as exc:
                raise SandboxError(f"the sandbox shell is gone ({exc})") from exc
            deadline = time.monotonic() + read_timeout
            out = b""
            needle = mark.encode()
            try:
                while True:  # until the marker line is complete
                    at = out.find(needle)
                    if at >= 0 and out.find(b"\n", at) >= 0:
                        break
                    out += self._read_frame(deadline)
            except TimeoutError as exc:
                self._sock = None  # the shell is stuck: this sandbox cannot be trusted any more
                raise SandboxError(f"the sandbox did not answer within {read_timeout:.0f}s") from exc
        return out.decode("utf-8", errors="replace")

    @staticmethod
    def _exit_code(tail: str) -> int:
        try:
            return int(tail.strip().split()[0])
        except (ValueError, IndexError):
            return -1

    def run(self, command: str, timeout: float = 60.0, max_output: int = DEFAULT_OUTPUT_CAP,
            also_read: str | None = None) -> CommandResult:
        """Run ``command`` with bash in the repository root; never longer than ``timeout`` seconds, and no
        process it started survives it (see the module docstring). ``also_read``: a file whose content is
        returned in ``CommandResult.extra``, read after the command's processes are gone."""
        mark = f"{self._MARK}{uuid.uuid4().hex[:16]}"
        secs = max(1, int(timeout + 0.999))
        t0 = time.monotonic()
        try:
            text = self._exchange(self._wrap(command, secs, max_output, mark, also_read) + "\n", mark + " ", secs + 15)
        except ShellExited:
            if not self.alive():
                raise
            # The command killed the shell itself (e.g. `kill -9 -1` of its own): a fresh one serves the next.
            self._open_shell()
            self._exchange(f"kill -9 -1 2>/dev/null; echo {mark} 0\n", mark + " ", 30)
            return CommandResult(137, "[the command killed the sandbox's shell; its processes were ended and a new "
                                      "shell was started]", False, time.monotonic() - t0)
        return self._result(text, mark, secs, max_output, t0)

    def run_as_grader(self, command: str, timeout: float = 300.0, max_output: int = DEFAULT_OUTPUT_CAP,
                      also_read: str | None = None) -> CommandResult:
        """Run ``command`` as :data:`GRADER_USER`, from a fresh ``docker exec``, like :meth:`run` otherwise.

        The grader's test run uses this: the repository belongs to the agent's uid and is only readable to
        this one, so code of the agent's that runs inside the test process (its library modules) cannot
        rewrite the restored tests, and no shell the agent's commands ever touched is involved."""
        mark = f"{self._MARK}{uuid.uuid4().hex[:16]}"
        secs = max(1, int(timeout + 0.999))
        if self._closed:
            raise SandboxError("the sandbox is closed")
        t0 = time.monotonic()
        try:
            api = self.client.api
            exec_id = api.exec_create(self.container_id, ["bash", "--noprofile", "--norc", "-c",
                                                          "exec 2>/dev/null; " + self._wrap(command, secs, max_output,
                                                                                            mark, also_read)],
                                      stdout=True, stderr=True, user=GRADER_USER, workdir=WORKDIR)["Id"]
            sock = api.exec_start(exec_id, socket=True, tty=False)
        except Exception as exc:
            raise SandboxError(f"the grader's command could not run: {exc}") from exc
        # Read the multiplexed frames to EOF on our own deadline (the API client's read timeout is shorter
        # than a long suite's budget).
        sock = getattr(sock, "_sock", sock)
        buf, payload, deadline = b"", [], time.monotonic() + secs + 30
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxError(f"the grader's command did not finish within {secs + 30}s")
                sock.settimeout(remaining)
                try:
                    chunk = sock.recv(65536)
                except socket.timeout as exc:
                    raise SandboxError(f"the grader's command did not finish within {secs + 30}s") from exc
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 8 and len(buf) >= 8 + struct.unpack(">I", buf[4:8])[0]:
                    size = struct.unpack(">I", buf[4:8])[0]
                    payload.append(buf[8:8 + size])
                    buf = buf[8 + size:]
        finally:
            try:
                sock.close()
            except OSError:
                pass
        text = b"".join(payload).decode("utf-8", errors="replace")
        if mark + " " not in text:
            raise SandboxError(f"the grader's command ended without its report: {text[-300:]}")
        return self._result(text, mark, secs, max_output, t0)

    @staticmethod
    def _wrap(command: str, secs: int, max_output: int, mark: str, also_read: str | None) -> str:
        """The shell line that runs one command.

        The command's output goes to a file, so waiting for the command is waiting for its own process, not
        for whoever holds its stdout; then ``kill -9 -1`` (a builtin: it works while a fork bomb holds every
        pid) ends every other process of the user, repeated without forking until nothing is left to kill,
        since a bomb can fork past one sweep. On a loaded machine 50 tight sweeps can still leave processes
        that are dying or that forked between sweeps (33 of a fork bomb's were alive at the next command in one
        CI run), so the sweeps go on 20 ms apart while ``/proc`` still lists a process of the user other than the shell
        (at most 5 s): the command returns only when none of its processes is left. (``kill -9 -1`` itself
        cannot tell: it returns success whenever the container has a process it may not signal, such as the
        root main process, so its status says nothing about what is left.) The exit code, the in-sandbox
        times, the OOM-kill and process-limit counters before and after, the output's size and the writable
        mounts' free blocks follow a unique marker."""
        half = max(1, max_output // 2)
        oom = "{ read -r _ _; read -r _ _; read -r _ %s; } </sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"
        pids = "{ read -r _ %s; } </sys/fs/cgroup/pids/pids.events 2>/dev/null"
        extra = f"echo {mark}FILE; cat {shlex.quote(also_read)} 2>/dev/null; " if also_read else ""
        return (f"cd {WORKDIR} 2>/dev/null; : >{OUTPUT_FILE}; __m0=0; __m1=0; __p0=0; __p1=0; {oom % '__m0'}; "
                f"{pids % '__p0'}; __t0=$EPOCHREALTIME; "
                f"timeout -k 2 {secs} bash -c {shlex.quote(command)} </dev/null >{OUTPUT_FILE} 2>&1; __trc=$?; "
                f"__t1=$EPOCHREALTIME; __k=0; while [ $__k -lt 50 ] && kill -9 -1 2>/dev/null; do __k=$((__k+1)); done; "
                f"__k=0; while [ $__k -lt 250 ]; do __left=; for __p in /proc/[0-9]*; do [ -O \"$__p\" ] && "
                f"[ \"${{__p#/proc/}}\" != $$ ] && {{ __left=1; break; }}; done; [ -z \"$__left\" ] && break; "
                f"kill -9 -1 2>/dev/null; sleep 0.02 2>/dev/null; __k=$((__k+1)); done; "
                f"{oom % '__m1'}; {pids % '__p1'}; "
                f"__n=$(stat -c %s {OUTPUT_FILE} 2>/dev/null); __n=${{__n:-0}}; __df=$(stat -f -c '%b:%a:%S' {' '.join(WRITABLE_MOUNTS)} 2>/dev/null); "
                f"if [ \"$__n\" -gt {max_output} ]; then head -c {half} {OUTPUT_FILE}; echo; echo {mark}CUT; "
                f"tail -c {half} {OUTPUT_FILE}; else cat {OUTPUT_FILE}; fi; echo; {extra}"
                f"echo {mark} $__trc $__t0 $__t1 $__m0 $__m1 $__n $__p0 $__p1 $__df")

    def _result(self, text: str, mark: str, secs: int, max_output: int, t0: float) -> CommandResult:
        half = max(1, max_output // 2)
        body, _, tail = text.rpartition(mark + " ")
        extra = None
        if f"{mark}FILE\n" in body:
            body, _, extra = body.partition(f"{mark}FILE\n")
        fields = tail.split()
        code = self._exit_code(tail)
        body = body[:-1] if body.endswith("\n") else body  # the echo before the marker
        truncated = f"{mark}CUT" in body
        if truncated:
            head, _, end = body.partition(f"{mark}CUT\n")
            body = head + f"… [output truncated: {fields[5] if len(fields) > 5 else '?'} bytes, showing the first " \
                f"and last {half}] …\n" + end
        try:
            inner = float(fields[2].replace(",", ".")) - float(fields[1].replace(",", "."))
        except (IndexError, ValueError):
            inner = None
        oom_killed = len(fields) > 4 and fields[4] != fields[3]
        pids_hit = len(fields) > 7 and fields[7] != fields[6]
        disk_full = []
        for mount, df in zip(WRITABLE_MOUNTS, fields[8:]):
            try:
                blocks, avail, _bsize = (int(x) for x in df.split(":"))
            except ValueError:
                continue
            if blocks and avail <= max(1, blocks // 200):  # under 0.5% left
                disk_full.append(mount)
        timed_out = code in (124, 137) and not oom_killed and inner is not None and inner >= secs - 0.05
        notes = []
        if oom_killed:
            notes.append(f"[killed: out of memory (limit {self.limits.memory_mb} MB)]")
        if timed_out:
            notes.append(f"[command timed out after {secs}s and was killed]")
        if pids_hit:
            notes.append(f"[the process limit ({self.limits.pids}) was reached: forks failed; every process the "
                         "command left was killed]")
        budgets = {WORKDIR: self.limits.repo_disk, "/tmp": self.limits.tmp_disk, "/dev/shm": self.limits.shm_disk}
        for mount in disk_full:
            notes.append(f"[disk budget exhausted: {mount} is full ({_size_mb(budgets[mount])} MB); "
                         "delete files there to free space]")
        if notes:
            body = (body + "\n" if body and not body.endswith("\n") else body) + "\n".join(notes)
        return CommandResult(code, body, timed_out, time.monotonic() - t0, truncated, oom_killed, tuple(disk_full),
                             pids_hit, inner, tuple(notes), extra)

    def kill_user_processes(self, wait_s: float = 10.0) -> None:
        """End every process of the sandbox user — the persistent shell included, whatever was done to it — from
        a fresh ``docker exec``, wait until none is left, and open a new shell."""
        script = ("for i in $(seq %d); do kill -9 -1 2>/dev/null; left=; for p in /proc/[0-9]*; do "
                  "[ -O \"$p\" ] && [ \"${p#/proc/}\" != $$ ] && left=1; done; [ -z \"$left\" ] && exit 0; "
                  "sleep 0.02; done; exit 1") % max(1, int(wait_s / 0.02))
        if self._closed:
            raise SandboxError("the sandbox is closed")
        with self._lock:
            self._drop_shell_socket()
            try:
                api = self.client.api
                exec_id = api.exec_create(self.container_id, ["bash", "--noprofile", "--norc", "-c", script],
                                          stdout=True, stderr=True, user=self.limits.user)["Id"]
                api.exec_start(exec_id)
                code = api.exec_inspect(exec_id).get("ExitCode")
            except Exception as exc:
                raise SandboxError(f"could not end the agent's processes: {exc}") from exc
            if code != 0:
                raise SandboxError(f"processes of the sandbox user survived {wait_s:.0f}s of SIGKILL")
            self._open_shell()

    def write_files(self, files: dict[str, bytes | str]) -> None:
        """Write files through the persistent shell: a base64 tar in a here-document, unpacked by ``tar`` as the
        sandbox user. One round trip of a few ms, where ``put_archive`` costs ~150-200 ms and unpacks as root."""
        if not files:
            return
        token = uuid.uuid4().hex[:16]
        mark, eof = f"{self._MARK}{token}", f"__TRACE_EOF_{token}"
        payload = base64.encodebytes(_tar_bytes(files)).decode("ascii")  # 76-character lines: never equal to eof
        script = (f"cd {WORKDIR} && base64 -d <<'{eof}' | tar -x -m --no-same-owner --no-overwrite-dir -f - 2>&1; "
                  f"__trc=$?; echo; echo {mark} $__trc\n{payload}{eof}\n")
        text = self._exchange(script, mark, 60 + len(payload) / 1e6)
        body, _, tail = text.partition(mark)
        if self._exit_code(tail) != 0:
            raise SandboxWriteError(f"could not write {', '.join(sorted(files))[:200]}: {body.strip()[-500:]}")

    def alive(self) -> bool:
        if self._closed:
            return False
        try:
            return self.client.api.inspect_container(self.container_id)["State"]["Running"]
        except Exception:
            return False

    def kill(self) -> None:
        """Kill the container (used by tests to simulate a crash mid-episode)."""
        self.client.api.kill(self.container_id)

    def _drop_shell_socket(self) -> None:
        """Close the persistent shell's socket, if any (a broken one is as good as closed)."""
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def close(self, wait: bool = True) -> None:
        """Remove the container. ``wait=False`` leaves the removal (~0.3-0.5 s of dockerd's time) to a daemon
        thread, so an environment's ``reset`` does not wait for the previous episode's container; the container
        stays registered until it is gone, so exit and signal cleanup still remove it if the thread has not."""
        if self._closed:
            return
        self._closed = True
        self._drop_shell_socket()
        if not self.container_id:
            return
        if wait:
            self._remove_now()
        else:
            threading.Thread(target=self._remove_now, name="trace-sandbox-remove", daemon=True).start()

    def _remove_now(self) -> None:
        with _LIVE_LOCK:
            registered = _LIVE.get(self.container_id) is self
        if registered:
            _remove_container(self.client, self.container_id)
            with _LIVE_LOCK:
                _LIVE.pop(self.container_id, None)

    def __repr__(self) -> str:
        return f"DockerSandbox({self.image}, {str(self.container_id)[:12]})"


def open_sandbox_ids() -> list[str]:
    """Ids of the containers this process has started and not yet removed."""
    with _LIVE_LOCK:
        return list(_LIVE)


def _image_labels(client, image_id: str, cache: dict) -> dict:
    if image_id not in cache:
        try:
            cache[image_id] = client.api.inspect_image(image_id)["Config"].get("Labels") or {}
        except Exception:
            cache[image_id] = {}
    return cache[image_id]


def labelled_containers(client=None, all_owners: bool = True) -> list:
    """Containers TRACE started (of every process, or only this one's).

    A container counts only if it carries :data:`RUN_LABEL` and its image does not: the label is set at
    ``docker run``, so a container someone else ran from a TRACE image (which inherits the image's
    labels) is never listed, even from an image built with that label.
    """
    client = client or docker_client()
    filters = {"label": [RUN_LABEL]}
    if not all_owners:
        filters["label"].append(f"org.trace.pid={os.getpid()}")
    images: dict = {}
    return [c for c in client.containers.list(all=True, filters=filters)
            if RUN_LABEL not in _image_labels(client, c.attrs.get("Image", ""), images)]


def owner_alive(container) -> bool:
    """Whether the process that started ``container`` still runs (same pid *and* same start time)."""
    token = container.labels.get(RUN_LABEL, "")
    pid = token.partition(":")[0]
    if not pid.isdigit():
        return False
    return process_token(int(pid)) == token


def cleanup_containers(client=None, only_dead_owners: bool = False) -> int:
    """Remove the containers TRACE started (:func:`labelled_containers`); returns how many.
    ``only_dead_owners`` spares those whose owner process is alive."""
    client = client or docker_client()
    removed = 0
    for container in labelled_containers(client):
        if only_dead_owners and owner_alive(container):
            continue
        _remove_container(client, container.id)
        removed += 1
    return removed


class ContainerPool:
    """Keeps ``size`` started sandboxes of one image ready, refilled in a background thread.

    A pooled container is used by one episode only and removed after it; the pool trades a
    few idle containers for a reset that skips container start-up.
    """

    def __init__(self, factory, size: int = 1):
        self.factory, self.size = factory, size
        self._ready: list[Sandbox] = []
        self._cv = threading.Condition()
        self._closed = False
        self._filling = 0
        install_signal_cleanup()  # the pool starts its sandboxes in threads, which cannot install handlers
        self._refill()

    def _refill(self) -> None:
        with self._cv:
            need = self.size - len(self._ready) - self._filling
            self._filling += max(0, need)
        for _ in range(max(0, need)):
            threading.Thread(target=self._add_one, daemon=True).start()

    def _add_one(self) -> None:
        box = None
        try:
            box = self.factory()
        except Exception as exc:
            (logger.debug if self._closed or _SHUTDOWN["now"] else logger.warning)("warm pool: could not start a sandbox: %s", exc)
        with self._cv:
            self._filling -= 1
            if box is not None:
                if self._closed:
                    box.close()
                else:
                    self._ready.append(box)
            self._cv.notify_all()

    def refill(self) -> None:
        """Start sandboxes in the background until the pool is full again."""
        self._refill()

    def acquire(self, wait_s: float = 0.0, refill: bool = True) -> Sandbox:
        """A ready sandbox (waiting up to ``wait_s`` for one being started), else a new one.

        ``refill=False`` leaves the refill to the caller (:meth:`refill`), who can start it once its own
        latency-critical work is done instead of competing with it for dockerd and the CPU."""
        deadline = time.monotonic() + wait_s
        box = None
        with self._cv:
            while not self._ready and self._filling and time.monotonic() < deadline:
                self._cv.wait(deadline - time.monotonic())
            if self._ready:
                box = self._ready.pop(0)
        if refill:
            self._refill()
        if box is not None and box.alive():
            return box
        if box is not None:
            box.close()
        return self.factory()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the pool is full (benchmarks use this to measure a warm reset)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while len(self._ready) < self.size and time.monotonic() < deadline:
                self._cv.wait(deadline - time.monotonic())

    def close(self) -> None:
        with self._cv:
            self._closed = True
            boxes, self._ready = self._ready, []
        for box in boxes:
            box.close()

    def open_resources(self) -> list[str]:
        with self._cv:
            return [repr(b) for b in self._ready] + ([f"{self._filling} starting"] if self._filling else [])


# ------------------------------------------------------------------------------------------ local

class LocalSandbox(Sandbox):
    """A temporary copy of the repository and ``subprocess`` (in ``bwrap`` without network when installed).

    Not a security boundary: agent commands run as the current user. Choose it explicitly
    (``sandbox="local"``) on machines without Docker. Each command runs in its own session; when it
    returns, its process group is killed (a process that starts a new session escapes this — another
    reason this sandbox is not a boundary).

    Args:
        source_dir: the clean repository to copy.
        python_path: directories (relative to the repository) put on ``PYTHONPATH``.
        requirements_dir: a directory of installed dependencies to add to ``PYTHONPATH``.
    """

    kind = "local"

    def __init__(self, source_dir: Path, python_path: list[str] | None = None, requirements_dir: Path | None = None):
        warnings.warn("LocalSandbox runs agent commands on this machine without container isolation "
                      + ("(bubblewrap: no network, read-only system)" if shutil.which("bwrap") else
                         "(bubblewrap not installed: no isolation at all)"), RuntimeWarning, stacklevel=2)
        self._tmp = tempfile.mkdtemp(prefix="trace-swe-local-")
        self.root = Path(self._tmp) / "testbed"
        shutil.copytree(source_dir, self.root, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        self.workdir = str(self.root)
        here = Path(__file__).parent
        self.harness = Harness(python=sys.executable, plugin=str(here / "pytest_report.py"),
                               pytest_runner=str(here / "sandbox_pytest.py"), tree_tool=str(here / "sandbox_tree.py"),
                               trusted=(str(requirements_dir),) if requirements_dir else (),
                               report=str(Path(self._tmp) / "report.json"), clean=str(Path(source_dir).resolve()),
                               path=os.environ.get("PATH", "/usr/bin:/bin"))
        paths = ([str(requirements_dir)] if requirements_dir else []) + [str(self.root / p) for p in (python_path or ["."])]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONDONTWRITEBYTECODE": "1"}
        self._bwrap = shutil.which("bwrap")
        # The interpreter, the harness and the repository's requirements may live under /tmp (a CI clone).
        self._rebinds = rebind_hidden([source_dir, *([requirements_dir] if requirements_dir else [])])
        self._closed = False

    def run(self, command: str, timeout: float = 60.0, max_output: int = DEFAULT_OUTPUT_CAP,
            also_read: str | None = None) -> CommandResult:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        argv = ["bash", "-c", command]
        if self._bwrap:
            argv = [self._bwrap, "--ro-bind", "/", "/", "--tmpfs", "/tmp", *self._rebinds, "--bind", self._tmp, self._tmp,
                    "--dev", "/dev",
                    "--proc", "/proc", "--unshare-net", "--die-with-parent", "--chdir", self.workdir] + argv
        t0 = time.monotonic()
        # Output to a file, not a pipe: waiting for the command is not waiting for whoever holds its stdout.
        with tempfile.TemporaryFile(dir=self._tmp) as out:
            proc = subprocess.Popen(argv, cwd=self.workdir, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code, timed_out = proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                code, timed_out = 124, True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the command's background processes go with it
            except ProcessLookupError:
                pass
            proc.wait()
            out.seek(0)
            raw = out.read(max_output * 4 + 1)
        text = raw.decode("utf-8", errors="replace")
        truncated = len(text) > max_output
        if truncated:
            text = text[:max_output] + f"\n… [output truncated at {max_output} characters]"
        notes = (f"[command timed out after {timeout:.0f}s and was killed]",) if timed_out else ()
        if timed_out:
            text += "\n" + notes[0]
        extra = None
        if also_read:
            try:
                extra = Path(also_read).read_text(encoding="utf-8", errors="replace")
            except OSError:
                extra = ""
        return CommandResult(code, text, timed_out, time.monotonic() - t0, truncated, notes=notes, extra=extra)

    def kill_user_processes(self) -> None:
        """Nothing to do beyond what :meth:`run` does (each command's process group is killed when it returns)."""

    def write_files(self, files: dict[str, bytes | str]) -> None:
        for rel, data in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)

    def alive(self) -> bool:
        return not self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self._tmp, ignore_errors=True)
