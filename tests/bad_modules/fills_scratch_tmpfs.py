# expect: admitted :: harmless
# attack: use
"""Defect (issue 58; admitted: harmless now): writes 50 files of 60 MB (each under the worker's file-size
limit) into its scratch /tmp through an aliased `open` (which the static filter does not see). A tmpfs lives
in the host's shared memory, outside the worker's memory limit: without a size it took 3,000 MB per worker.
The scratch tmpfs now has a size (`SandboxLimits.tmpfs_mb`, 128 MB), and / and /dev are read-only."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

_write = open


def _fill():
    wrote, block = 0, b"x" * (1 << 20)
    try:
        for i in range(50):
            with _write(f"/tmp/fill{i}", "wb") as fh:
                for _ in range(60):
                    fh.write(block)
                    fh.flush()
                    wrote += 1
    except OSError as exc:
        return f"LOOT: wrote {wrote} MB of scratch, stopped by {exc.strerror}"
    return f"LOOT: wrote {wrote} MB of scratch, unstopped"


class BadEnv(PreconditionVerificationEnv):
    filled = False

    def reset(self, *, seed=None, options=None):
        if not BadEnv.filled:
            BadEnv.filled = True
            print(_fill(), flush=True)
        return super().reset(seed=seed, options=options)
