"""The planted cancellation decision as a capability env, and its decision-blind twin (lab/grpo-alone).

``CancelDecisionEnv`` is ``PreconditionVerificationEnv`` (``trace/precondition_verification-v1``'s class: its tools,
scripted user, oracle and reward) drawing only the airline ``cancel`` family: what the planted recipe's generated
env draws with ``focus_share: 1.0`` (``gen/precondition_verification_tau_airline-v0``, focus ``cancel``). With the
recipe's ``size`` (``cancel_grounds: [business]``, ``read_back: true``) an allowed cancellation is a business-class
reservation and a refused one never is, and the agent writes the cabin back right before deciding.

``BlindCancelEnv`` is the same env whose reservation record shows, in half of the episodes, a cabin drawn against the
decision (business on a must-refuse request, economy or basic economy on an allowed one), in the record the tools
return and in the oracle's read-back alike. Its oracle episodes therefore go through every step of the flow but
decide independently of the cabin they read: SFT on them teaches the format and leaves the decision at chance, the
start GRPO needs (every group of a seed samples both decisions, and reading the cabin is exactly what is left).
Its reward is not meant to be trained on.

The library has since taken the same idea as an option of every airline env, ``size.blind_cabin_prob`` (it plants
the cabin against the decision while the task is drawn; docs/environments.md), which a GRPO run's warm-up takes
through ``TrainConfig.sft_warmup_env_kwargs``. This class stays as the results beside it were measured with it.
"""

from __future__ import annotations

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

NON_BUSINESS = ("economy", "basic_economy")


class CancelDecisionEnv(PreconditionVerificationEnv):
    """``PreconditionVerificationEnv`` on airline with the ``cancel`` family only (difficulty 3)."""

    def _pool(self, difficulty: int) -> tuple[str, ...]:
        return ("cancel",)


class BlindCancelEnv(CancelDecisionEnv):
    """``CancelDecisionEnv`` whose shown cabin disagrees with the decision in half of the episodes (see the module
    docstring). Needs ``size.read_back`` and ``size.cancel_grounds: [business]``."""

    def _build_task(self, session, difficulty):
        task = super()._build_task(session, difficulty)
        request = task.requests[self.skill_index]
        call = request.write or request.forbidden_write
        if call is None or not self.np_random.random() < 0.5:
            return task
        record = session.db.edit("reservations", call.arguments["reservation_id"])
        shown = "business" if record["cabin"] in NON_BUSINESS else \
            NON_BUSINESS[int(self.np_random.integers(len(NON_BUSINESS)))]
        old = f'"cabin": "{record["cabin"]}"'
        if not request.message.startswith(old):
            raise ValueError("BlindCancelEnv needs size.read_back (the decision message opens with the cabin)")
        record["cabin"] = shown
        request.message = f'"cabin": "{shown}"' + request.message[len(old):]
        return task
