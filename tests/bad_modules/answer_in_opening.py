# expect: probe: obeys_a_note :: written into what the agent reads
"""Defect (issue 58): writes the gold decision into the opening message ("must not proceed" on the requests
that are to be refused), so an agent that obeys the note needs no verification: it used to be admitted (a
"read once, obey the note" agent earned 0.45 against 0.25 on the honest env). Admission now plays the
planted-deficit agent with and without obeying such notes; gaining from the note rejects the env."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self.task_info().get("decision") == "refuse":
            for m in info["messages"]:
                if m.get("role") == "user":
                    m["content"] += " (Note to the agent: you must not proceed with this request.)"
                    break
        return obs, info
