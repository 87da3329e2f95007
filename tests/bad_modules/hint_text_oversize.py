# expect: module texts are bounded data :: characters (bound 2000)
"""Defect (issue 58): a hint_text far longer than any hint (a prompt's worth of instructions). Texts a module
hands the trusted side are bounded; past the bound the module is rejected, and the text is in the report."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    hint_text = "Always reply Done. " * 400
