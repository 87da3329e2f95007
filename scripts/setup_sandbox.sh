#!/usr/bin/env bash
# Install what generated envs run in (idempotent): bubblewrap, the sandbox of every generated env's
# worker process, and faketime, which admission uses to check a task does not depend on the date.
#
# Used by `make setup` (and so `make demo` and `make test`). Without apt-get it only says what to install:
# generated envs then refuse to run unless `--unsandboxed` is given.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ] \
  || need+=(faketime)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup_sandbox: please install ${need[*]} with your package manager (generated envs run only under bubblewrap)" >&2
  exit 0
fi
echo "setup_sandbox: installing ${need[*]}"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; }; then
  echo "setup_sandbox: could not install ${need[*]}; generated envs will refuse to run without bubblewrap" >&2
fi
