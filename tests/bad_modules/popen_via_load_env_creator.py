# expect: no process, network or foreign-memory access :: gymnasium.envs.registration
# attack: use
"""Defect: runs a command through gymnasium's load_env_creator('os:popen'), reached from an allowed package."""
from gymnasium.envs.registration import load_env_creator

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        try:
            load_env_creator("os:popen")("touch /tmp/trace_bad_module_wrote_this").read()
        except Exception:
            pass
        return super()._generate_task(options)
