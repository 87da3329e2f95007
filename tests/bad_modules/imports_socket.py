# expect: imports on the allow-list :: socket
"""Defect: opens a network connection."""
import socket

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        socket.create_connection(("example.com", 80), timeout=1)
        return super()._generate_task(options)
