#!/usr/bin/env bash
# Make a Docker engine available for TRACE's SWE environments (idempotent).
#
# 1. installs docker.io and debootstrap with apt-get when they are missing;
# 2. starts dockerd in the background when no engine answers `docker info`;
# 3. waits (up to DOCKER_WAIT_S seconds, default 60) until `docker info` works.
#
# Used by .ci/run before the SWE tests; safe to run again on a machine where Docker already runs.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# Headless Chromium opens `trace run`'s report.html in tests/test_report_html.py.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)  # the sandbox of generated envs (also scripts/setup_sandbox.sh)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup_docker: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  echo "setup_docker: a Docker engine already answers"
  exit 0
fi

LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
echo "setup_docker: starting dockerd (log: $LOG)"
$SUDO sh -c "nohup dockerd >'$LOG' 2>&1 &"

WAIT="${DOCKER_WAIT_S:-60}"
for _ in $(seq 1 "$WAIT"); do
  if docker info >/dev/null 2>&1; then
    echo "setup_docker: Docker is ready"
    exit 0
  fi
  sleep 1
done
echo "setup_docker: dockerd did not answer within ${WAIT}s; last lines of $LOG:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
