"""The LLM generator agent: writes an env module for a capability spec, and rewrites it after a rejection.

Used by :func:`generators.generate` when an OpenAI-compatible endpoint is given (``--llm URL
--model NAME``), through the shared client :class:`trace_envs.core.llm.ChatClient`. The prompt is
assembled from the files in ``generators/prompts/`` (``system.md``, ``task.md``,
``env_contract.md``, ``retry.md``; ``string.Template`` placeholders) with what the model needs:
the spec (name, definition, statistics), excerpts of failed evidence trajectories and of
successful trajectories on the same target, the target's tool schemas and policy (its system
prompt), the environment contract and a worked example (a built-in capability env's source).

On rejection the conversation continues: the model's previous reply, then the admission report
(which check failed, its traceback or figure), and a request for the corrected module. Every
attempt's prompt, reply and extracted module are written to the attempt's folder.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from string import Template
from typing import Any

PROMPTS = Path(__file__).resolve().parent / "prompts"
#: The worked example shown to the model, by target family.
EXAMPLES = {"tau": "precondition_verification", "swe": "swe_localization"}


class LLMGenerationError(RuntimeError):
    """The endpoint could not be reached or answered with an error (after the client's retries)."""


def prompt_template(name: str) -> Template:
    return Template((PROMPTS / name).read_text(encoding="utf-8"))


def _excerpt(messages: list[dict], max_chars: int) -> str:
    lines = []
    for m in messages:
        if m.get("role") == "system":
            continue
        text = str(m.get("content") or "")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            text += f" <tool_call>{fn.get('name')}({fn.get('arguments')})</tool_call>"
        lines.append(f"[{m.get('role')}] {' '.join(text.split())[:400]}")
    out = "\n".join(lines)
    return out if len(out) <= max_chars else out[:max_chars] + "\n[...]"


def extract_module(reply: str) -> str:
    """The module in a reply: the last fenced python block that parses, else the last fenced block, else the text."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", reply, re.S)
    for block in reversed(blocks):
        try:
            ast.parse(block)
            return block
        except SyntaxError:
            continue
    if blocks:
        return blocks[-1]
    return reply.strip() + "\n"


class GeneratorAgent:
    """Writes env modules with an LLM behind an OpenAI-compatible endpoint.

    Args:
        base_url: the endpoint, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model's name.
        api_key: the API key (``EMPTY`` for local servers).
        temperature: sampling temperature.
        max_tokens: reply token budget.
        timeout: seconds per request.
        excerpt_chars: characters per evidence trajectory excerpt.
        max_examples: failed (and successful) trajectories shown.
        example_chars: characters of the worked example's source shown.
    """

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", temperature: float = 0.7,
                 max_tokens: int = 4096, timeout: float = 300.0, excerpt_chars: int = 2500, max_examples: int = 3,
                 example_chars: int = 20000):
        from trace_envs.core.llm import ChatClient

        self.client = ChatClient(base_url, model, api_key=api_key, timeout=timeout)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.excerpt_chars, self.max_examples, self.example_chars = excerpt_chars, max_examples, example_chars

    # -------------------------------------------------------------------------------------- prompt
    def task_prompt(self, spec: dict, *, env_id: str, capability: str, target_schemas: list[dict]) -> str:
        target_env = spec["target_env"]
        failed = spec.get("example_failures") or []
        succeeded = _successes(spec, self.max_examples)
        family = "swe" if "swe" in target_env else "tau"
        import trace_envs.capabilities as caps

        example = Path(caps.__file__).resolve().parent / f"{EXAMPLES[family]}.py"
        stats = {k: v for k, v in (spec.get("statistics") or {}).items() if not isinstance(v, (list, dict))}
        return prompt_template("task.md").safe_substitute(
            env_id=env_id, capability=capability, definition=spec.get("definition", ""), target_env=target_env,
            statistics=json.dumps(stats) if stats else "n/a",
            n_failed=len(failed[:self.max_examples]),
            failed_excerpts="\n\n".join(
                f"### {ex.get('trajectory')} (seed {ex.get('seed')})\nEvidence: {ex.get('evidence', '')}\n\n"
                f"```\n{str(ex.get('transcript', ''))[:self.excerpt_chars]}\n```" for ex in failed[:self.max_examples])
            or "(none in the spec)",
            n_succeeded=len(succeeded),
            succeeded_excerpts="\n\n".join(f"```\n{_excerpt(r.get('messages') or [], self.excerpt_chars)}\n```"
                                           for r in succeeded) or "(none found)",
            tool_schemas=json.dumps(target_schemas, indent=1),
            policy=_policy(target_env)[:self.excerpt_chars * 2],
            env_contract=prompt_template("env_contract.md").safe_substitute(),
            example_path=f"trace_envs/capabilities/{example.name}",
            example_source=example.read_text(encoding="utf-8")[:self.example_chars])

    def messages(self, spec: dict, *, env_id: str, capability: str, target_schemas: list[dict],
                 history: list[tuple[str, Any]]) -> list[dict]:
        """The conversation for the next attempt: system, task, then (reply, report) per earlier attempt."""
        out = [{"role": "system", "content": prompt_template("system.md").safe_substitute()},
               {"role": "user", "content": self.task_prompt(spec, env_id=env_id, capability=capability,
                                                            target_schemas=target_schemas)}]
        for attempt, (source, report) in enumerate(history, 1):
            out.append({"role": "assistant", "content": f"```python\n{source}```"})
            out.append({"role": "user", "content": prompt_template("retry.md").safe_substitute(
                env_id=env_id, attempt=attempt, report=report.feedback())})
        return out

    # -------------------------------------------------------------------------------------- write
    def write_module(self, spec: dict, *, env_id: str, capability: str, target_schemas: list[dict],
                     history: list[tuple[str, Any]], attempt_dir: Path) -> str:
        """One attempt: prompt the model, keep prompt and reply in ``attempt_dir``, return the module source."""
        messages = self.messages(spec, env_id=env_id, capability=capability, target_schemas=target_schemas,
                                 history=history)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        (attempt_dir / "prompt.json").write_text(json.dumps(messages, indent=1, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
        (attempt_dir / "prompt.md").write_text("\n\n".join(f"## {m['role']}\n\n{m['content']}" for m in messages)
                                               + "\n", encoding="utf-8")
        try:
            reply = self.client.complete(messages, temperature=self.temperature, max_tokens=self.max_tokens)
        except Exception as exc:  # connection refused, HTTP errors after retries, timeouts
            (attempt_dir / "reply.md").write_text(f"(no reply: {type(exc).__name__}: {exc})\n", encoding="utf-8")
            raise LLMGenerationError(f"the generator model at {self.client.client.base_url} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        (attempt_dir / "reply.md").write_text(reply, encoding="utf-8")
        return extract_module(reply)


def _policy(target_env: str) -> str:
    """The target's system prompt (policy, tool list and call format), from one reset."""
    import gymnasium as gym

    import trace_envs  # noqa: F401 - registers the ids
    from trace_envs.core.registry import get_entry

    try:
        if get_entry(target_env).requires:
            return f"(the target {target_env} needs {list(get_entry(target_env).requires)}; see its tool schemas)"
    except KeyError:
        return f"(unknown target {target_env})"
    env = gym.make(target_env)
    try:
        _, info = env.reset(seed=0)
        messages = info.get("messages") or []
        return str(messages[0].get("content", "")) if messages else ""
    finally:
        env.close()


def _successes(spec: dict, limit: int) -> list[dict]:
    """Successful trajectories on the spec's target, from the trajectory file the analysis read (if it is there)."""
    source = (spec.get("source") or {}).get("trajectories")
    paths = [Path(p) for p in (source if isinstance(source, list) else [source]) if p]
    out = []
    for path in paths:
        if path.is_dir():
            path = path / "trajectories.jsonl"
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("success") and record.get("env_id") == spec.get("target_env"):
                    out.append(record)
                    if len(out) >= limit:
                        return out
    return out
