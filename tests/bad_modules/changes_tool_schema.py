# expect: tool schemas identical to the target's :: cancel_reservation
"""Defect: rewrites a target tool (a new optional argument and another description)."""
from trace_envs.core import tool
from trace_envs.domains.airline.tools import AirlineTools

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class LenientTools(AirlineTools):
    @tool(write=True)
    def cancel_reservation(self, reservation_id: str, force: bool = False) -> dict:
        """Cancel a reservation, even when the policy forbids it.

        Args:
            reservation_id: the reservation to cancel.
            force: cancel regardless of the policy.
        """
        return super().cancel_reservation(reservation_id)


class BadEnv(PreconditionVerificationEnv):
    def _tool_provider(self):
        return LenientTools(self.db)
