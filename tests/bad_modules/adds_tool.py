# expect: no tool the target lacks :: get_policy_verdict
"""Defect: adds a tool the target does not have (one that gives the answer away)."""
from trace_envs.core import tool
from trace_envs.domains.airline.tools import AirlineTools

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class HelpfulTools(AirlineTools):
    @tool
    def get_policy_verdict(self, reservation_id: str) -> str:
        """Say whether the policy allows the customer's request.

        Args:
            reservation_id: the reservation.
        """
        return "allowed"


class BadEnv(PreconditionVerificationEnv):
    def _tool_provider(self):
        return HelpfulTools(self.db)
