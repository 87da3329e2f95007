"""A small client for OpenAI-compatible chat endpoints (vLLM, ``transformers serve``, hosted APIs).

Used by the LLM user simulator here, and by the agents, analysis and
generator stages. The ``openai`` package is imported on first use, so
``import trace_envs`` stays light.
"""

from __future__ import annotations

import time
from typing import Any


class ChatClient:
    """Chat completions with timeouts and retries with exponential backoff.

    Args:
        base_url: the endpoint's base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model's name.
        api_key: the API key (``EMPTY`` for local servers).
        timeout: seconds per request.
        max_retries: retries after a failed request (connection errors, 5xx, timeouts, and a 400 whose server could
            not parse the model's own reply: ``transformers serve`` 5.25 answers a malformed tool call that way, where
            5.24 answered 500, and a new sample usually parses). Any other 4xx is not retried; its error carries the
            server's reason (e.g. a prompt longer than the model's context).
        backoff: the first retry's delay in seconds; doubled each retry.
    """

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", timeout: float = 60.0,
                 max_retries: int = 2, backoff: float = 0.5):
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("the LLM client needs the `openai` package: pip install 'trace-rl[llm]'") from exc
        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff
        # Retries are ours (with our backoff), so the SDK's own are off.
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0, "failures": 0}

    def chat(self, messages: list[dict], **kwargs: Any) -> Any:
        """One chat completion (the raw response object); retried on transient failures."""
        import openai

        delay = self.backoff
        for attempt in range(self.max_retries + 1):
            try:
                response = self.client.chat.completions.create(model=self.model, messages=messages, **kwargs)
                self.usage["requests"] += 1
                if getattr(response, "usage", None) is not None:
                    self.usage["prompt_tokens"] += response.usage.prompt_tokens or 0
                    self.usage["completion_tokens"] += response.usage.completion_tokens or 0
                return response
            except (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
                    openai.RateLimitError, openai.APIStatusError) as exc:
                transient = not isinstance(exc, openai.APIStatusError) or isinstance(
                    exc, (openai.InternalServerError, openai.RateLimitError)) or _unparsed_reply(exc)
                if isinstance(exc, openai.APIStatusError):
                    exc = _with_detail(exc)
                if not transient:
                    raise exc from None
                self.usage["failures"] += 1
                if attempt == self.max_retries:
                    raise exc from None
                time.sleep(delay)
                delay *= 2
        raise RuntimeError("unreachable")

    def complete(self, messages: list[dict], **kwargs: Any) -> str:
        """The text of one chat completion."""
        response = self.chat(messages, **kwargs)
        return response.choices[0].message.content or ""


def status_detail(exc: Any) -> str:
    """What the server said about a rejected request: the body's ``detail``/``message``/``error`` (FastAPI and
    OpenAI-style bodies), else the start of its text. The SDK's own message shows only an OpenAI-style
    ``message``, so a FastAPI server's reason (``{"detail": ...}``) would otherwise be lost."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        for key in ("detail", "message", "error"):
            if body.get(key):
                value = body[key]
                return str(value.get("message", value) if isinstance(value, dict) else value)[:500]
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return ""


def _unparsed_reply(exc: Any) -> bool:
    """A 400 whose server generated a reply and could not parse it (``transformers serve``'s response parser on a
    malformed tool call): the request was fine, the sample was not."""
    return getattr(exc, "status_code", None) == 400 and "could not parse" in status_detail(exc)


def _with_detail(exc: Any) -> Any:
    """``exc`` with the server's reason in its message (same class, response and body)."""
    detail = status_detail(exc)
    if not detail or detail in str(exc):
        return exc
    return type(exc)(f"{exc} - {detail}", response=exc.response, body=exc.body)
