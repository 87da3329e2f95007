"""User simulators for the τ²-style domains.

:class:`ScriptedUser` is the default: deterministic, instant, and unable to
invent facts. It answers identity questions from its scenario's
``known_info``, raises its requests one at a time, says yes when the agent
describes an action and asks for confirmation, and ends the conversation the
way τ²-bench's simulator does, with ``###STOP###`` (done), ``###TRANSFER###``
(handed to a human) or ``###OUT-OF-SCOPE###`` (asked for something it cannot
know, repeatedly).

:class:`LLMUser` role-plays the same scenario with a model behind any
OpenAI-compatible endpoint, for more natural (and less predictable) users.

How the scripted user reads the agent (lower-cased message):

* a confirmation request — "do you confirm", "(yes/no)", "shall i proceed", "would you like me to proceed"
  → "Yes, please go ahead.";
* "anything else" → the next request, or ``###STOP###`` when none is left;
* a question about the user's identity or records — "your user id", "your email", "your zip",
  "your name", "reservation id", "order id" — → the known fact, or "I don't know my …" (never invented);
* any other question → the current request's details;
* any other statement → the request is taken as handled (the next request, or ``###STOP###``) only
  if it reads as an outcome: not a filler announcement ("Let me look into that.", "One moment.",
  "Sure."), and either the agent acted on the request (a successful tool call since the user raised
  it) or the statement reports a result or a refusal ("done", "cancelled", "has been updated",
  "I can't", "not eligible", a number...). Anything else gets "Okay." and counts as a turn without
  progress; after ``max_unhelpful`` of those the user gives up (``###STOP###``).

The scripted user is a stand-in that makes episodes deterministic and instant. τ²-bench's official
tasks (``tau2_data=``) are written for an LLM user — their scenarios are instructions to a model,
with facts the user reveals only when asked — so evaluating an agent on them faithfully wants
:class:`LLMUser` (``user={"base_url": ..., "model": ...}``); the scripted user there is for gold
replays and smoke tests.
"""

from __future__ import annotations

import re
from typing import Any

from .task import TauTask

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"

_CONFIRM = re.compile(r"do you confirm|\(yes/no\)|shall i proceed|would you like me to proceed|should i proceed"
                      r"|can you confirm|please confirm")
_FACTS = [  # (fact key in known_info, phrases that ask for it)
    ("user_id", ("user id", "user_id", "customer id")),
    ("email", ("email",)),
    ("name", ("your name", "full name", "first and last name", "first name")),
    ("zip", ("zip", "postal code")),
    ("reservation_id", ("reservation id", "reservation number", "booking id", "confirmation number")),
    ("order_id", ("order id", "order number")),
]
_FACT_LABELS = {"user_id": "user id", "email": "email", "name": "name", "zip": "zip code",
                "reservation_id": "reservation id", "order_id": "order id"}
# A statement that reports what happened to a request (so the user may move on), not filler.
_OUTCOME = re.compile(r"\b(done|completed?|cancel+ed|updated|changed|modified|booked|sent|added|refunded|"
                      r"processed|submitted|requested|transferr\w*|is now|has been|have been|was|were|"
                      r"unable|cannot|can't|can not|could not|couldn't|not able|not eligible|ineligible|"
                      r"not possible|not allowed|no longer|sorry|unfortunately|afraid|policy|here is|here are|"
                      r"found|there (is|are)|your \w+ (is|are))\b|\d")
# A statement that only announces work ("Let me check that.", "One moment."): never an answer.
_FILLER = re.compile(r"^\W*(sure|okay|ok|alright|all right|certainly|of course|great|thanks?|thank you)?[,.! ]*"
                     r"(let me\b|i('| wi)ll (check|look|see|verify|pull)|i am (checking|looking)|i'm (checking|looking)|"
                     r"(just )?(one|a) (moment|second|minute)|please (hold|wait|bear with)|hold on|give me a\b|"
                     r"checking\b|looking (into|up)\b|working on it)|"
                     r"^\W*(sure|okay|ok|alright|all right|certainly|of course|great)\W*$")
_ASKING = re.compile(r"\?|\bplease (provide|share|tell|give)\b|\bcould you (provide|share|tell|give)\b"
                     r"|\bmay i have\b|\bwhat is\b|\bwhat's\b")


class ScriptedUser:
    """The deterministic default user (see the module docstring for its rules).

    Args:
        task: the task whose scenario and requests the user plays.
        max_unhelpful: consecutive turns without progress after which the user gives up (``###STOP###``).
    """

    def __init__(self, task: TauTask, max_unhelpful: int = 4):
        self.task = task
        self.current = 0
        self.unknown_asks = 0
        self.unhelpful = 0
        self.max_unhelpful = max_unhelpful
        self._raised_at = 0  # transcript length when the current request was raised

    def opening(self) -> str:
        return self.task.user.opening

    def _acted(self, messages: list[dict] | None) -> bool:
        """Whether a tool call succeeded since the current request was raised."""
        return any(m.get("role") == "tool" and not str(m.get("content", "")).startswith("Error:")
                   for m in (messages or [])[self._raised_at:])

    def _advance(self, messages: list[dict] | None = None) -> str:
        self.current += 1
        self.unhelpful = 0
        self._raised_at = len(messages or [])
        if self.current < len(self.task.requests):
            return self.task.requests[self.current].text
        return f"Thank you, that's all I needed. {STOP}"

    def respond(self, message: str, messages: list[dict] | None = None) -> str:
        text = message.lower()
        if _CONFIRM.search(text):
            self.unhelpful = 0
            return "Yes, please go ahead."
        if "anything else" in text:
            return self._advance(messages)
        asked = [key for key, phrases in _FACTS if any(p in text for p in phrases)]
        if asked and _ASKING.search(text):
            known = self.task.user.known_info
            answers = [f"My {_FACT_LABELS[k]} is {known[k]}." for k in asked if known.get(k)]
            if answers:
                self.unknown_asks = 0
                return " ".join(answers)
            self.unknown_asks += 1
            if self.unknown_asks >= 2:
                return f"I don't have that information. {OUT_OF_SCOPE}"
            missing = " or ".join(_FACT_LABELS[k] for k in asked)
            return f"Sorry, I don't know my {missing}."
        if "?" in text:
            self.unhelpful += 1
            if self.unhelpful >= self.max_unhelpful:
                return f"This isn't going anywhere. {STOP}"
            request = self.task.requests[min(self.current, len(self.task.requests) - 1)]
            return request.details or request.text
        if not _FILLER.search(text) and (self._acted(messages) or _OUTCOME.search(text)):
            return self._advance(messages)
        self.unhelpful += 1  # filler ("Let me check that."): wait for the outcome
        if self.unhelpful >= self.max_unhelpful:
            return f"This isn't going anywhere. {STOP}"
        return "Okay."


class LLMUser:
    """A user role-played by a model behind an OpenAI-compatible endpoint.

    Args:
        task: the task whose scenario the model plays.
        base_url: the endpoint, e.g. ``http://localhost:8000/v1``.
        model: the model name the endpoint serves.
        api_key: the key, if the endpoint needs one.
        temperature: sampling temperature.
    """

    def __init__(self, task: TauTask, base_url: str, model: str, api_key: str = "EMPTY",
                 temperature: float = 0.0, timeout: float = 60.0):
        from ..core.llm import ChatClient

        self.task = task
        self.client = ChatClient(base_url=base_url, model=model, api_key=api_key, timeout=timeout)
        self.temperature = temperature
        facts = "\n".join(f"- {k}: {v}" for k, v in task.user.known_info.items())
        requests = "\n".join(f"{i + 1}. {r.text}" for i, r in enumerate(task.requests))
        self.system = (
            "You are a customer talking to a customer-service agent. Stay in character and write only what the "
            f"customer says.\nPersona: {task.user.persona}\nFacts you know (never invent others):\n{facts}\n"
            f"Your requests, one at a time, in this order:\n{requests}\n{task.user.instructions}\n"
            f"When everything is handled, end with {STOP}. If you are transferred to a human, reply {TRANSFER}. "
            f"If the agent needs information you do not have, reply {OUT_OF_SCOPE}."
        )

    def opening(self) -> str:
        return self.task.user.opening

    def respond(self, message: str, messages: list[dict] | None = None) -> str:
        # The simulator sees the conversation from the other side: the agent's messages are "user" turns.
        history: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        for m in messages or []:
            if m["role"] == "user":
                history.append({"role": "assistant", "content": m["content"]})
            elif m["role"] == "assistant" and m.get("content") and not m.get("tool_calls"):
                history.append({"role": "user", "content": m["content"]})
        if not messages or messages[-1].get("content") != message:
            history.append({"role": "user", "content": message})
        try:
            return self.client.complete(history, temperature=self.temperature).strip() or "..."
        except Exception as exc:  # an unreachable user model ends the episode, it does not crash it
            return f"(the simulated user failed: {type(exc).__name__}) {STOP}"
