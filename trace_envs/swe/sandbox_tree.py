"""Puts the repository tree in the state the SWE grader trusts, inside the sandbox.

Copied into every sandbox image as ``/opt/trace/bin/trace_tree.py``; run by
:func:`trace_envs.swe.tasks.restore_for_grading` (after every process of the agent is gone) with
``python3 -I -S`` and a JSON request on stdin. It never runs git: the agent could have planted
hooks, filters or an ``fsmonitor`` in ``.git``, and the agent's ``HEAD`` is not the instance's.

``grade``: the reference is the clean tree baked read-only into the image (``/opt/trace/clean``),
which is also the instance's tree for every protected file (bugs only touch source files).

1. scratch directories (``/tmp``, ``/dev/shm``) are emptied; every file becomes owner-writable and
   world-readable but writable by nobody else, without ACLs (the grader's test run reads the tree as
   another uid, which must not be able to change it);
2. every ``__pycache__`` and ``.pyc`` goes (a forged cache entry would be imported instead of a
   restored test), and so do FIFOs, sockets and every symlink the clean tree does not have;
3. every protected path (test paths, test-looking files, conftests, pytest/packaging config,
   ``*.pth``, ``sitecustomize``) is deleted and copied back from the clean tree, after unlinking
   whatever the agent left at that path or in place of one of its parent directories;
4. the answer lists the non-protected files that differ from the expected (bugged) tree, with
   their text, and those deleted: the agent's patch, as the grader will test it.

``reset``: make the tree exactly the clean tree again (``.git`` kept); used between reference checks.

This file must import nothing but the standard library: it runs inside the sandbox's Python.
"""

import hashlib
import json
import os
import re
import shutil
import stat
import sys


def _sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Rules:
    """Which relative paths are protected (restored from the clean tree, never taken from the agent)."""

    def __init__(self, spec):
        self.paths = [p.strip("/") for p in spec.get("paths", []) if p.strip("/") not in ("", ".")]
        self.names = set(spec.get("names", []))
        self.suffixes = tuple(spec.get("suffixes", []))
        self.patterns = [re.compile(p) for p in spec.get("patterns", [])]

    def protected(self, rel):
        if any(rel == p or rel.startswith(p + "/") for p in self.paths):
            return True
        base = rel.rsplit("/", 1)[-1]
        if base in self.names or base.endswith(self.suffixes):
            return True
        return any(p.search(rel) for p in self.patterns)


def _remove(path):
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
    except FileNotFoundError:
        pass


def _empty(directory):
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        _remove(os.path.join(directory, name))


_ACL_XATTRS = ("system.posix_acl_access", "system.posix_acl_default")


def _normal_permissions(path, st):
    """Owner read/write (and search for directories), readable by all — the grader's test run reads the tree
    as another uid — and no ACL that could let that uid write (a default ACL would be inherited by the
    restored files)."""
    want = 0o755 if stat.S_ISDIR(st.st_mode) else 0o644
    try:
        if (st.st_mode & want) != want:
            os.chmod(path, (st.st_mode | want) & ~0o022)
        elif st.st_mode & 0o022:
            os.chmod(path, st.st_mode & ~0o022)
    except OSError:
        pass
    for name in _ACL_XATTRS:
        try:
            os.removexattr(path, name)
        except (OSError, AttributeError):
            pass


def _give_back_permissions(root):
    _normal_permissions(root, os.stat(root))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                _normal_permissions(full, st)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]


def _clean_entries(clean):
    """{rel: ("file", path) | ("link", target)} of the clean tree (no .git, no caches)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(clean):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__")]
        rel_dir = os.path.relpath(dirpath, clean)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            out[rel] = ("link", os.readlink(full)) if os.path.islink(full) else ("file", full)
    return out


def _scrub(root, clean_entries, rules, dropped):
    """Steps 2 and 3a: remove caches, special files, foreign symlinks and every protected path."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=True):
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for name in dirnames:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel == ".git":
                continue
            if name == "__pycache__":
                _remove(full)
            elif os.path.islink(full):
                if clean_entries.get(rel) != ("link", os.readlink(full)):
                    _remove(full)
                    if not rules.protected(rel):
                        dropped.append(rel)
            elif rules.protected(rel) and any(rel == p for p in rules.paths):
                _remove(full)  # a whole test directory: copied back below
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                if clean_entries.get(rel) != ("link", os.readlink(full)):
                    _remove(full)
                    if not rules.protected(rel):
                        dropped.append(rel)
            elif not stat.S_ISREG(st.st_mode) or name.endswith((".pyc", ".pyo")) or rules.protected(rel):
                _remove(full)


def _place(root, rel, entry):
    """Copy one clean entry to ``root/rel``, replacing whatever stands at that path or at a parent's."""
    parts = rel.split("/")
    current = root
    for part in parts[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current) or (os.path.exists(current) and not os.path.isdir(current)):
            _remove(current)
        if not os.path.isdir(current):
            os.mkdir(current)
    target = os.path.join(root, rel)
    if os.path.lexists(target):
        _remove(target)
    kind, value = entry
    if kind == "link":
        os.symlink(value, target)
    else:
        shutil.copyfile(value, target)
        shutil.copystat(value, target)


def grade(request):
    root, clean = request["root"], request["clean"]
    rules = Rules(request["protected"])
    for directory in request.get("wipe", []):
        _empty(directory)
    _give_back_permissions(root)
    clean_entries = _clean_entries(clean)
    dropped = []
    _scrub(root, clean_entries, rules, dropped)
    for rel, entry in sorted(clean_entries.items()):
        if rules.protected(rel):
            _place(root, rel, entry)
    _give_back_permissions(root)
    # The agent's patch: non-protected regular files that differ from the expected tree.
    expected = dict(request.get("expected", {}))  # rel -> sha256 of the bugged version (others: the clean one)
    max_file = int(request.get("max_file", 200_000))
    changed, large, seen = {}, [], set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not (rel_dir == "." and d == ".git")]
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rules.protected(rel) or os.path.islink(full):
                continue
            seen.add(rel)
            want = expected.get(rel)
            if want is None and clean_entries.get(rel, ("", ""))[0] == "file":
                want = _sha(clean_entries[rel][1])
            if want is not None and _sha(full) == want:
                continue
            try:
                if os.path.getsize(full) > max_file:
                    raise ValueError
                with open(full, encoding="utf-8") as fh:
                    changed[rel] = fh.read()
            except (ValueError, UnicodeDecodeError, OSError):
                large.append(rel)
    deleted = sorted(rel for rel, (kind, _) in clean_entries.items()
                     if kind == "file" and not rules.protected(rel) and rel not in seen)
    return {"changed": changed, "large": sorted(large), "deleted": deleted, "dropped": sorted(dropped)}


def reset(request):
    root, clean = request["root"], request["clean"]
    for directory in request.get("wipe", []):
        _empty(directory)
    _give_back_permissions(root)
    for name in os.listdir(root):
        if name != ".git":
            _remove(os.path.join(root, name))
    for rel, entry in sorted(_clean_entries(clean).items()):
        _place(root, rel, entry)
    return {"reset": True}


def main(argv):
    request = json.loads(sys.stdin.read())
    actions = {"grade": grade, "reset": reset}
    if len(argv) != 1 or argv[0] not in actions:
        raise SystemExit("usage: trace_tree.py grade|reset < request.json")
    sys.stdout.write(json.dumps(actions[argv[0]](request)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
