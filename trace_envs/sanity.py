"""Sanity tasks for RL trainers: one-turn envs whose answer is readable from the prompt.

A trainer is trusted when it learns what the reward asks for, and nothing when the reward carries no
information (docs/train.md, "Does the trainer learn?"). These envs are the field's sanity tasks in TRACE's
own format: one user message, one assistant reply, a reward of 1 for the right answer and 0 otherwise. The
right answer is fully determined by the prompt, so a policy that reads it scores 1.0 and a policy that
guesses scores chance; there are no tools, no multi-turn credit assignment and no partial credit, so a
trainer that does not climb here has a bug, not a hard problem.

* ``trace/sanity_cabin-v0`` (:class:`CabinDecisionEnv`): the planted cancellation decision of the headline
  recipe in miniature. The prompt is a reservation record and a cancellation request; the policy allows it
  only for a business-class cabin. The reply reads the cabin back and decides (``business: yes``), as the
  planted recipe's agent does: the decision rests on one field of the record among distractors.
* ``trace/sanity_pair-v0`` (:class:`PairedWordEnv`): the system prompt lists word pairs, the user names a
  first word, the answer is its pair (a four-way mapping set by the prompt).

Each answer is gold with equal probability (drawn from the seed), and ``task_info()["scenario"]`` is the gold
answer, so that balanced accuracy (the mean of per-answer accuracies) comes straight from trajectory records.
``answers()`` lists the answer set, ``answer_of(reply)`` reads a reply's answer (case and punctuation ignored) and
``reply(answer)`` writes the reply that gives an answer.
"""

from __future__ import annotations

import re
from typing import Any

from .core.env import Policy, TraceEnv

#: The pairs of :class:`PairedWordEnv` (first word -> its pair).
WORD_PAIRS = (("north", "south"), ("window", "aisle"), ("morning", "evening"), ("silver", "gold"), ("red", "green"))
CABINS_REFUSED = ("economy", "basic_economy")
AIRPORTS = ("JFK", "LAX", "SFO", "ORD", "ATL", "SEA", "BOS", "MIA", "DEN", "PHX")

_FIRST_WORD = re.compile(r"[A-Za-z_]+")


def first_of(text: str, words: tuple[str, ...]) -> str:
    """The first word of ``text`` (lower-cased) that is one of ``words``; ``""`` if none is."""
    return next((w for w in (m.lower() for m in _FIRST_WORD.findall(text or "")) if w in words), "")


def first_word(text: str) -> str:
    """The first word of a reply, lower-cased (``"Yes, it can."`` -> ``"yes"``; none -> ``""``)."""
    match = _FIRST_WORD.search(text or "")
    return match.group(0).lower() if match else ""


class SanityEnv(TraceEnv):
    """One user message, one reply, reward 1 for the gold answer (see the module docstring).

    Subclasses set ``self._gold`` and return the prompt in ``_generate_task``, and list ``answers()``.
    """

    nonblocking_step = True

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self._gold = ""
        self._spec: dict = {}

    def answers(self) -> tuple[str, ...]:
        """Every answer this env's tasks can have (the classes of balanced accuracy)."""
        raise NotImplementedError

    @property
    def gold(self) -> str:
        """The current task's right answer."""
        return self._gold

    def answer_of(self, reply: str) -> str:
        """The answer a reply gives (default: its first word)."""
        return first_word(reply)

    def _evaluate(self) -> tuple[float, dict]:
        replies = [m.get("content") or "" for m in self._messages if m["role"] == "assistant"]
        said = self.answer_of(replies[-1]) if replies else ""
        right = float(said == self._gold)
        return right, {"answer": right, "answered_from_set": float(said in self.answers())}

    def task_spec(self) -> dict:
        return dict(self._spec)

    def task_info(self) -> dict:
        return {"scenario": self._gold}

    def reply(self, answer: str) -> str:
        """The reply that gives ``answer`` to the current task (the oracle's, with the gold answer)."""
        return answer

    def oracle(self) -> Policy:
        text = self.reply(self._gold)
        return lambda observation, info: text


class CabinDecisionEnv(SanityEnv):
    """The planted cancellation decision as a one-turn bandit.

    Description:
        A reservation record (id, route, passengers, cabin, and ``distractors`` more fields) and a request to
        cancel it. The policy allows a cancellation only for a business-class reservation. The agent answers
        ``yes`` (it may be cancelled) or ``no``.

    Observation / Action:
        Text. The action is the assistant's reply; only its first word counts.

    Rewards:
        1.0 for the right decision, else 0.0. ``reward_breakdown``: ``answer`` (the same) and
        ``answered_from_set`` (1 when the first word was ``yes`` or ``no``, right or wrong).

    Episode end:
        After the first reply (a tool call or unreadable action is rejected and the reply still awaited).

    Arguments:
        distractors: extra record fields (0-4) before the cabin.
        read_back: the reply first names the cabin, then decides (``business: yes``), as the planted recipe's
            agent reads the cabin back before its decision; the decision is the first ``yes``/``no`` of the reply.
            The decision then follows the word it rests on; without the read-back a LoRA on the tiny base did not
            learn to find the cabin in a sanity run's budget, by GRPO or by SFT (docs/train.md, "Does the trainer
            learn?").

    Version history:
        v0: first version.
    """

    def __init__(self, distractors: int = 2, read_back: bool = True, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        if not isinstance(distractors, int) or isinstance(distractors, bool) or not 0 <= distractors <= 4:
            raise ValueError(f"distractors must be an integer in 0..4, got {distractors!r}")
        if not isinstance(read_back, bool):
            raise ValueError(f"read_back must be true or false, got {read_back!r}")
        self.distractors, self.read_back = distractors, read_back
        self._cabin = ""

    def answer_of(self, reply: str) -> str:
        if not self.read_back:
            return first_word(reply)
        return first_of(reply, self.answers())

    def reply(self, answer: str) -> str:
        return f"{self._cabin}: {answer}" if self.read_back else answer

    def answers(self) -> tuple[str, ...]:
        return ("yes", "no")

    def system_prompt(self) -> str:
        answer = ("Name the cabin, then answer yes or no (e.g. `economy: no`)." if self.read_back
                  else "Answer with one word: yes or no.")
        return ("You decide whether a reservation may be cancelled. Policy: a reservation may be cancelled only "
                f"if its cabin is business. {answer}")

    def _generate_task(self, options: dict) -> str:
        rng = self.np_random
        allowed = bool(rng.integers(2))
        cabin = "business" if allowed else CABINS_REFUSED[int(rng.integers(len(CABINS_REFUSED)))]
        rid = "".join(chr(ord("A") + int(c)) for c in rng.integers(26, size=3)) + str(int(rng.integers(100, 1000)))
        origin, destination = (AIRPORTS[int(i)] for i in rng.choice(len(AIRPORTS), size=2, replace=False))
        extra = [("passengers", str(int(rng.integers(1, 5)))), ("origin", origin), ("destination", destination),
                 ("insurance", "yes" if rng.integers(2) else "no")]
        order = rng.permutation(len(extra))[: self.distractors]
        # The cabin closes the record, next to the reply: the tiny model reads what is near (a field in the middle
        # of the record is a retrieval problem of its own, not the decision this task isolates).
        fields = [("reservation_id", rid)] + [extra[int(i)] for i in order] + [("cabin", cabin)]
        self._gold, self._cabin = ("yes" if allowed else "no"), cabin
        self._spec = {"fields": fields, "gold": self._gold, "read_back": self.read_back}
        record = ", ".join(f'"{k}": "{v}"' for k, v in fields)
        return f"Please cancel reservation {rid}. May it be cancelled?\nReservation: {{{record}}}"


class PairedWordEnv(SanityEnv):
    """Answer the word paired with the one the prompt names.

    Description:
        The system prompt lists ``pairs`` word pairs (``north -> south`` ...); the user names a first word. The
        reply reads it back and gives its pair (``north: south``). The mapping is the prompt's, not the language's:
        a policy must learn which answer goes with which word, as a tool-using agent learns which action goes
        with which record.

    Observation / Action:
        Text. The action is the assistant's reply; its answer is its first word from the answer set.

    Rewards:
        1.0 for the paired word, else 0.0. ``reward_breakdown``: ``answer`` (the same) and ``answered_from_set``
        (1 when the reply gave one of the answers, right or wrong).

    Episode end:
        After the first reply.

    Arguments:
        pairs: how many pairs (2-5): chance is 1 / pairs.

    Version history:
        v0: first version.
    """

    def __init__(self, pairs: int = 4, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        if not isinstance(pairs, int) or isinstance(pairs, bool) or not 2 <= pairs <= len(WORD_PAIRS):
            raise ValueError(f"pairs must be an integer in 2..{len(WORD_PAIRS)}, got {pairs!r}")
        self.pairs = pairs
        self._cue = ""

    def answers(self) -> tuple[str, ...]:
        return tuple(b for _, b in WORD_PAIRS[: self.pairs])

    def task_count(self) -> int:
        return self.pairs  # one task per named word: a contextual bandit

    def answer_of(self, reply: str) -> str:
        return first_of(reply, self.answers())

    def reply(self, answer: str) -> str:
        return f"{self._cue}: {answer}"

    def system_prompt(self) -> str:
        pairs = ", ".join(f"{a} -> {b}" for a, b in WORD_PAIRS[: self.pairs])
        return f"Pairs: {pairs}. Name the user's word, then its pair (e.g. `{WORD_PAIRS[0][0]}: {WORD_PAIRS[0][1]}`)."

    def _generate_task(self, options: dict) -> str:
        self._cue, self._gold = WORD_PAIRS[int(self.np_random.integers(self.pairs))]
        self._spec = {"word": self._cue, "gold": self._gold}
        return f"Word: {self._cue}"


def make_reply_scorer(env_id: str, env_kwargs: dict | None = None) -> Any:
    """``score(seed, reply) -> float``: the env's reward of ``reply`` as the answer to seed ``seed``'s task (what
    a trainer that generates outside the env, e.g. TRL's stock ``GRPOTrainer`` on the same prompts, rewards)."""
    import gymnasium as gym

    env = gym.make(env_id, **(env_kwargs or {}))

    def score(seed: int, reply: str) -> float:
        env.reset(seed=int(seed))
        _, reward, _, _, _ = env.step(reply)
        return float(reward)

    return score
