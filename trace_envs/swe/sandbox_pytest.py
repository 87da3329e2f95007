"""Runs pytest for TRACE's SWE tools and grader, inside the sandbox, where the repository cannot shadow it.

Copied into every sandbox image as ``/opt/trace/bin/trace_pytest.py`` and started by
:meth:`trace_envs.swe.repos.Repo.pytest_command` as::

    env -i ... python3 -s -S -P trace_pytest.py --plugin FILE [--trusted DIR]... [--path DIR]... -- PYTEST_ARGS

Why it exists: ``python3 -m pytest`` puts the working directory, then ``$PYTHONPATH`` (the
repository), in front of the standard library, and runs ``site`` (``sitecustomize``, ``.pth``
files, the user site). A file the agent leaves in the repository could then replace the report
plugin, ``json``, ``pytest`` itself or any module a test imports, and every test would "pass".
Here the interpreter starts without ``site`` (``-S``), the user site (``-s``) or the script's
directory (``-P``) on the path; the report plugin is loaded from its absolute file and handed to
``pytest.main`` as an object (no name lookup); the standard library, the image's site directories
and the trusted dependency directories come first on ``sys.path``, and the repository's
directories only after them, with ``--import-mode=append`` so that pytest's own insertion of test
directories goes to the end too. Plugins are not auto-loaded from entry points (a ``.dist-info``
in the repository could name one); those installed in the trusted directories are passed with
``-p``. Everything but the standard library is imported before the repository is on the path,
and the process ends with ``os._exit`` once pytest has written its report, so no ``atexit``
handler registered by the repository's code runs after it.

This file must import nothing but the standard library: it runs inside the sandbox's Python.
"""

import sys


def _parse(argv):
    if "--" not in argv:
        raise SystemExit("usage: trace_pytest.py --plugin FILE [--trusted DIR]... [--path DIR]... -- PYTEST_ARGS")
    cut = argv.index("--")
    opts, pytest_args = argv[:cut], argv[cut + 1:]
    found = {"--plugin": [], "--trusted": [], "--path": []}
    for i in range(0, len(opts), 2):
        if opts[i] not in found or i + 1 >= len(opts):
            raise SystemExit(f"trace_pytest.py: unknown or incomplete option {opts[i]!r}")
        found[opts[i]].append(opts[i + 1])
    if len(found["--plugin"]) != 1:
        raise SystemExit("trace_pytest.py: give the report plugin's file with --plugin FILE")
    return found["--plugin"][0], found["--trusted"], found["--path"], pytest_args


def _entry_point_plugins(dirs):
    """Module names of the pytest plugins installed in ``dirs`` (their ``pytest11`` entry points)."""
    import importlib.metadata

    names = []
    for dist in importlib.metadata.distributions(path=list(dirs)):
        for ep in dist.entry_points:
            if ep.group == "pytest11":
                module = ep.value.split(":")[0].strip()
                if module and module not in names:
                    names.append(module)
    return names


def main(argv):
    plugin_file, trusted, repo_paths, pytest_args = _parse(argv)
    import site

    # The interpreter's own site directories, without processing their .pth files (nothing there is the
    # repository's: the image's root filesystem is read-only), then the dependencies installed for the repo.
    for directory in list(site.getsitepackages()) + list(trusted):
        if directory not in sys.path:
            sys.path.append(directory)
    import importlib.util

    spec = importlib.util.spec_from_file_location("trace_pytest_report", plugin_file)
    plugin = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = plugin
    spec.loader.exec_module(plugin)
    import pytest

    plugin_args = []
    for module in _entry_point_plugins(list(site.getsitepackages()) + list(trusted)):
        plugin_args += ["-p", module]
    sys.path.extend(repo_paths)  # last: the repository can add modules, never replace one
    args = ["--import-mode=append", "-p", "no:cacheprovider", *plugin_args, *pytest_args]
    return pytest.main(args, plugins=[plugin])


if __name__ == "__main__":
    code = int(main(sys.argv[1:]))
    sys.stdout.flush()
    sys.stderr.flush()
    import os

    # The report is written; leave before atexit handlers or finalizers of the repository's code can run.
    os._exit(code)
