"""Model-backed agents: an OpenAI-compatible endpoint, or a local Hugging Face model.

Both satisfy the agent interface of :mod:`trace_envs.agents` — ``agent(observation, info) -> action``
plus an optional ``reset(env, observation, info)`` — and add ``act_batch(observations, infos)``, which
:mod:`trace_train.rollouts` uses to serve many environments in flight at once:

* :class:`OpenAIChatAgent` sends ``info["messages"]`` (and the tool schemas through the API's ``tools``
  field, or as a Hermes ``<tools>`` block in text mode) to any chat-completions endpoint — ``vllm serve``,
  ``transformers serve``, a hosted API — through the project's one endpoint client,
  :class:`trace_envs.core.llm.ChatClient` (timeouts, retries with exponential backoff). Requests run in
  a thread pool under a concurrency limit. Whatever goes wrong (a timeout, a 500, a reply that is
  not a tool call the env can read) becomes an action the environment answers with an error, so an
  episode never crashes on the agent's side.
* :class:`HFAgent` renders the conversation with the tokenizer's chat template (``tools=``) and generates
  for a whole batch of environments at once, optionally through a PEFT adapter or an already-loaded (e.g.
  composed) model: with one ``generate`` call (left padding), or, for the tiny Qwen3 models, with the
  hand-written loop of :mod:`trace_train.tiny.fast_decode` (``decode``).

Both keep token accounting in ``agent.stats``. ``torch``, ``transformers`` and ``openai`` are imported
when an agent is built, never at module import.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

from trace_envs.agents import register_agent
from trace_envs.core.conversation import hermes_tool_call, tool_response_text, tools_block

logger = logging.getLogger(__name__)


@dataclass
class AgentStats:
    """Token and call accounting of a model-backed agent (cumulative; thread-safe updates)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    errors: int = 0
    seconds: float = 0.0
    last_errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "retries": self.retries, "errors": self.errors, "seconds": round(self.seconds, 3)}


def agent_error_action(message: str) -> str:
    """An action that reports an agent-side failure to the environment.

    It is a ``<tool_call>`` block whose body is not JSON, so every TRACE env rejects it with an error
    observation (the turn counts toward ``too_many_errors``) and the episode goes on or ends cleanly.
    The text starts with ``[agent error]`` so that transcripts and logs show what happened.
    """
    one_line = " ".join(str(message).split())[:500]
    return f"<tool_call>[agent error] {one_line}</tool_call>"


def is_agent_error(action: Any) -> bool:
    return isinstance(action, str) and action.startswith("<tool_call>[agent error]")


# ----------------------------------------------------------------------------- OpenAI-compatible endpoint


def _text_mode_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a server without tool support: tools in the system text, calls as Hermes text."""
    out: list[dict] = []
    header = ("# Tools\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.\n"
              + tools_block(tools)) if tools else ""
    rest = messages
    if messages and messages[0]["role"] == "system":
        system = messages[0]["content"] + ("\n\n" + header if header else "")
        rest = messages[1:]
    else:
        system = header
    if system:
        out.append({"role": "system", "content": system})
    for m in rest:
        if m["role"] == "assistant" and m.get("tool_calls"):
            parts = [m.get("content") or ""]
            for tc in m["tool_calls"]:
                fn = tc["function"]
                try:
                    args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
                except json.JSONDecodeError:
                    args = fn["arguments"]
                parts.append(hermes_tool_call(fn["name"], args))
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif m["role"] == "tool":
            text = tool_response_text(m.get("content") or "")
            if out and out[-1]["role"] == "user" and out[-1]["content"].endswith("</tool_response>"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def _api_messages(messages: list[dict]) -> list[dict]:
    """The transcript as the chat-completions API expects it (no extra keys, content never None)."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m["role"] == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [{"id": tc.get("id") or f"call_{i}", "type": "function",
                                  "function": {"name": tc["function"]["name"],
                                               "arguments": tc["function"]["arguments"]
                                               if isinstance(tc["function"]["arguments"], str)
                                               else json.dumps(tc["function"]["arguments"])}}
                                 for i, tc in enumerate(m["tool_calls"])]
        if m["role"] == "tool":
            msg["tool_call_id"] = m.get("tool_call_id", "")
        out.append(msg)
    return out


class OpenAIChatAgent:
    """An agent behind any OpenAI-compatible chat-completions endpoint.

    Args:
        model: the model name the server expects.
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        api_key: sent as the bearer token (local servers accept anything).
        tool_mode: ``"api"`` sends the schemas in the ``tools`` field and reads ``tool_calls`` from the
            reply (falling back to ``<tool_call>`` text in the content); ``"text"`` puts the schemas in
            the system message and replays past calls as Hermes text, for servers without tool support.
        temperature, max_tokens, top_p: sampling settings sent with each request.
        timeout: seconds per request.
        max_retries: retries after a timeout, connection error, rate limit or 5xx (4xx are not retried).
        backoff: first retry delay in seconds; doubles per retry.
        concurrency: requests in flight at most, across all threads using this agent.
        extra_body: extra JSON fields for the request (e.g. ``{"chat_template_kwargs": {...}}``).
        name: the agent name written into trajectories.
    """

    def __init__(self, model: str, base_url: str = "http://127.0.0.1:8000/v1", api_key: str = "EMPTY",
                 tool_mode: str = "api", temperature: float = 0.0, max_tokens: int = 512, top_p: float | None = None,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.5,
                 concurrency: int = 8, extra_body: dict | None = None, name: str | None = None) -> None:
        if tool_mode not in ("api", "text"):
            raise ValueError(f"tool_mode must be 'api' or 'text', got {tool_mode!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        import openai

        from trace_envs.core.llm import ChatClient

        self._openai = openai
        self.chat_client = ChatClient(base_url, model, api_key=api_key, timeout=timeout, max_retries=max_retries,
                                      backoff=backoff)
        self.client = self.chat_client.client  # the raw openai.OpenAI client
        self.model, self.tool_mode = model, tool_mode
        self.temperature, self.max_tokens, self.top_p = temperature, max_tokens, top_p
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.extra_body = dict(extra_body or {})
        self.name = name or f"openai:{model}"
        self.stats = AgentStats()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrency)
        self._pool: ThreadPoolExecutor | None = None

    # -- interface
    def reset(self, env: Any, observation: str, info: dict) -> None:
        """Stateless: the whole conversation travels in ``info`` each turn."""

    def __call__(self, observation: str, info: dict) -> Any:
        return self._act(info)

    def act_batch(self, observations: Sequence[str], infos: Sequence[dict]) -> list[Any]:
        """One action per env; requests run concurrently (at most ``concurrency`` in flight)."""
        if len(infos) <= 1:
            return [self._act(info) for info in infos]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="openai-agent")
        return list(self._pool.map(self._act, infos))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        self.client.close()

    # -- internals
    def _request(self, info: dict) -> dict:
        tools = info.get("tools") or []
        kwargs: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.top_p is not None:
            kwargs["top_p"] = self.top_p
        if self.tool_mode == "api":
            kwargs["messages"] = _api_messages(info["messages"])
            if tools:
                kwargs["tools"] = tools
        else:
            kwargs["messages"] = _text_mode_messages(info["messages"], tools)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def _act(self, info: dict) -> Any:
        kwargs = self._request(info)
        retryable = (self._openai.APITimeoutError, self._openai.APIConnectionError, self._openai.RateLimitError,
                     self._openai.InternalServerError)
        t0 = time.perf_counter()
        messages = kwargs.pop("messages")
        failures = self.chat_client.usage["failures"]
        try:
            with self._slots:
                response = self.chat_client.chat(messages, **kwargs)
        except retryable as exc:
            return self._fail(f"request failed after {self.max_retries + 1} attempts: {type(exc).__name__}: {exc}",
                              t0, retries=self.max_retries)
        except self._openai.APIStatusError as exc:  # 4xx: retrying will not help
            return self._fail(f"the server rejected the request ({exc.status_code}): {exc}", t0)
        except Exception as exc:  # a reply the client cannot even decode
            return self._fail(f"unreadable reply: {type(exc).__name__}: {exc}", t0)
        with self._lock:  # exact when requests are sequential; a fair count under concurrency
            self.stats.retries += max(0, self.chat_client.usage["failures"] - failures)
        try:
            action = self._to_action(response)
        except Exception as exc:
            return self._fail(f"unreadable reply: {type(exc).__name__}: {exc}", t0)
        usage = getattr(response, "usage", None)
        with self._lock:
            self.stats.calls += 1
            self.stats.seconds += time.perf_counter() - t0
            if usage is not None:
                self.stats.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
                self.stats.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
        return action

    def _to_action(self, response: Any) -> Any:
        choices = getattr(response, "choices", None)
        if not choices:
            raise ValueError("the reply has no choices")
        message = choices[0].message
        content = message.content or ""
        calls = getattr(message, "tool_calls", None) or []
        if not calls:
            return content  # text; the env parses any <tool_call> block in it
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": getattr(c, "id", "") or "", "type": "function",
                                "function": {"name": c.function.name, "arguments": c.function.arguments}}
                               for c in calls]}

    def _fail(self, message: str, t0: float, retries: int = 0) -> str:
        logger.warning("%s: %s", self.name, message)
        with self._lock:
            self.stats.retries += retries
            self.stats.calls += 1
            self.stats.errors += 1
            self.stats.seconds += time.perf_counter() - t0
            self.stats.last_errors = (self.stats.last_errors + [message])[-20:]
        return agent_error_action(message)


# ----------------------------------------------------------------------------- local Hugging Face model

#: How :class:`HFAgent` decodes (see its ``decode`` argument).
DECODE_CHOICES = ("auto", "fast", "hf")


class HFAgent:
    """A local ``transformers`` causal LM as an agent, with batched generation across envs.

    Args:
        model: a model folder / hub id (loaded with ``AutoModelForCausalLM``), a composed folder written by
            ``trace compose`` (it holds ``compose.json``; loaded as a :class:`trace_train.compose.ComposedModel`),
            or an already-loaded model — then pass ``tokenizer`` too.
        tokenizer: a tokenizer or its folder (default: the model's folder).
        adapter: a PEFT adapter folder applied on top of the model.
        threads: ``torch.set_num_threads`` (1 is fastest for tiny models on CPU); None leaves it alone.
        device: torch device.
        max_new_tokens: generation cap per turn.
        temperature: 0 = greedy; otherwise sampling with ``top_p``.
        max_prompt_tokens: longer prompts are cut from the left (with a warning).
        batch_size: most sequences per ``generate`` call; larger batches are split.
        chat_template_kwargs: passed to ``apply_chat_template`` (default none: the prompt ends with
            ``<|im_start|>assistant\n``, as in the SFT warm-up and TRL's GRPO rollouts).
        seed: torch seed set once when sampling (``temperature > 0``); greedy decoding needs none.
        prefix_cache: keep each conversation's keys/values between turns and encode only the new
            tokens of the next prompt (the conversation grows by a few tokens a turn, so this removes
            most of the prompt encoding). Up to ``2 * batch_size`` conversations are kept. A new conversation
            reuses the longest prefix it shares with a kept one (the system prompt), unless the model's
            ``prefix_scope`` puts the two in different scopes (per-episode routing: the adapter chosen for each).
        name: agent name in trajectories (default: the model folder's name).
        decode: ``hf`` generates with ``model.generate``; ``fast`` with :class:`trace_train.tiny.fast_decode.FastDecoder`
            (a hand-written loop for Qwen3-architecture models, optionally with a PEFT LoRA or as a token-level
            composed model: the prefix the batch shares is attended once for all rows, tested token-for-token
            against ``generate``), and with ``generate`` (and a warning) for a model it does not take, e.g. a
            composed one with per-episode routing; ``auto`` (default)
            takes ``fast`` for the tiny presets' models on CPU and ``hf`` for every other model.
            ``agent.decode`` says which one is in use.
        top_k: top-k filter when sampling; None is what ``generate`` uses (the model's generation config, else 50);
            0 samples from the full softmax (what a GRPO loss assumes).
        record_samples: keep, after each call, every row's sampled token ids (end token included) and their
            log-probabilities under the distribution they were drawn from in ``last_samples``; the rollout loop
            copies them into the trajectory record (``sampled_turns``) so a trainer can compare them with its own.
    """

    def __init__(self, model: Any, tokenizer: Any = None, adapter: str | None = None, threads: int | None = 1,
                 device: str = "cpu", max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                 max_prompt_tokens: int = 8192, batch_size: int = 64, chat_template_kwargs: dict | None = None,
                 seed: int | None = 0, name: str | None = None, dtype: Any = None,
                 prefix_cache: bool = True, decode: str = "auto", top_k: int | None = None,
                 record_samples: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if decode not in DECODE_CHOICES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_CHOICES)}, got {decode!r}")
        if threads:
            torch.set_num_threads(threads)
        if seed is not None and temperature > 0:
            torch.manual_seed(seed)
        if isinstance(model, str):
            self.model_path = model
            from trace_train.compose import is_composed_dir, load_composed

            if is_composed_dir(model):  # `trace compose` output (a composed model, or PEFT's Arrow over adapters)
                model_obj = load_composed(model, dtype=dtype or torch.float32)
            else:
                model_obj = AutoModelForCausalLM.from_pretrained(model, dtype=dtype or torch.float32)
        else:
            self.model_path = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
            model_obj = model
        if tokenizer is None:
            if not isinstance(model, str):
                raise ValueError("pass tokenizer= when model is an already-loaded model")
            tokenizer = model
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if adapter:
            from peft import PeftModel

            model_obj = PeftModel.from_pretrained(model_obj, adapter)
        self.model = model_obj.to(device).eval()
        self.device = device
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_prompt_tokens, self.batch_size = max_prompt_tokens, batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.name = name or (f"hf:{self.model_path.rstrip('/').split('/')[-1]}" + (f"+{adapter.rstrip('/').split('/')[-1]}"
                                                                                    if adapter else ""))
        self.stats = AgentStats()
        eos = self.model.generation_config.eos_token_id if self.model.generation_config is not None else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        for t in ("<|im_end|>", self.tokenizer.eos_token):
            tid = self.tokenizer.convert_tokens_to_ids(t) if t else None
            if isinstance(tid, int) and tid >= 0 and tid != self.tokenizer.unk_token_id and tid not in eos:
                eos.append(tid)
        self.eos_ids = eos
        if prefix_cache and getattr(self.model, "stateful_routing", False):
            # A context-gated composed model routes each token on every token before it, which a cache of keys
            # and values alone does not carry: it re-reads the whole conversation every turn.
            logger.info("%s: routing reads the whole sequence; the prefix cache is off", self.name)
            prefix_cache = False
        self.prefix_cache = prefix_cache
        # (tokens, keys/values, scope): a conversation's cache is reused only by prompts of the same scope
        # (see _scopes).
        self._cache_entries: list[tuple[list[int], list[tuple[Any, Any]], Any]] = []
        self.cached_prompt_tokens = 0
        self._cache_kwarg = "cache"
        self._end_markers = [m for m in ("<|im_end|>", "<|endoftext|>", self.tokenizer.eos_token) if m]
        self.top_k = top_k
        self.decoder = None  # a FastDecoder when decoding the fast way
        self.record_samples = record_samples
        #: With ``record_samples``: per row of the last call, (sampled token ids, their sampler log-probabilities).
        self.last_samples: list[tuple[list[int], list[float]]] = []
        from .tiny import fast_decode

        use_fast = decode == "auto" and str(device).startswith("cpu") and fast_decode.auto_applies(self.model)
        if decode == "fast":
            use_fast, why = fast_decode.supported(self.model)
            if not use_fast:  # e.g. per-episode routing: it keeps generate()
                logger.warning("%s: decode='fast' does not apply to this model (%s); using generate()", self.name, why)
        if use_fast:
            self.decoder = fast_decode.FastDecoder(self.model, store_limit=max(2, 2 * batch_size) if prefix_cache
                                                   else 0)
        self.decode = "fast" if self.decoder is not None else "hf"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        """Stateless: the conversation travels in ``info``."""

    def __call__(self, observation: str, info: dict) -> str:
        return self.act_batch([observation], [info])[0]

    def prompt(self, info: dict) -> str:
        """The generation prompt for an env's next turn."""
        return self.tokenizer.apply_chat_template(info["messages"], tools=info.get("tools") or None,
                                                  add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)

    def act_batch(self, observations: Sequence[str], infos: Sequence[dict]) -> list[str]:
        """Generate one turn for each env in one batched ``generate`` call (split at ``batch_size``)."""
        out: list[str] = []
        samples: list[tuple[list[int], list[float]]] = []
        for start in range(0, len(infos), self.batch_size):
            out.extend(self._generate([self.prompt(i) for i in infos[start:start + self.batch_size]]))
            samples.extend(self.last_samples)
        self.last_samples = samples if self.record_samples else []
        return out

    # -- prefix cache: per conversation, the keys/values of the tokens seen so far
    def _scopes(self, ids: list[list[int]]) -> list[Any]:
        """Each prompt's cache scope: keys/values are shared only between conversations of the same scope.

        A model whose keys/values for a prefix depend on what comes after it (per-episode routing chooses the
        adapter for the whole sequence from the first user message) says so with ``prefix_scope``; for every
        other model the scope is None and any conversation's prefix may serve another."""
        scope_of = getattr(self.model, "prefix_scope", None)
        return [scope_of(seq) for seq in ids] if callable(scope_of) else [None] * len(ids)

    def _lookup(self, seq: list[int], scope: Any = None) -> tuple[int, int]:
        """(entry index, length of the common prefix) of the stored conversation of ``scope`` sharing most of
        ``seq``."""
        best, best_len = -1, 0
        for i, (tokens, _, entry_scope) in enumerate(self._cache_entries):
            if entry_scope != scope:
                continue
            n = min(len(tokens), len(seq))
            k = 0
            while k < n and tokens[k] == seq[k]:
                k += 1
            if k > best_len:
                best, best_len = i, k
        return best, best_len

    def _batch_cache(self, ids: list[list[int]], width: int, scopes: list[Any]):
        """A batched cache of the first ``C`` padded columns, built from the stored conversations; (cache, C)."""
        from transformers import DynamicCache

        pads = [width - len(seq) for seq in ids]
        found = [self._lookup(seq, scope) for seq, scope in zip(ids, scopes)]
        cached = min(pad + k for pad, (_, k) in zip(pads, found))
        cached = min(cached, width - 1)
        if cached <= 0 or all(k == 0 for _, k in found):
            return None, 0
        reference = self._cache_entries[next(i for i, _ in found if i >= 0)][1]
        cache = DynamicCache()
        for layer, (k0, v0) in enumerate(reference):
            keys = k0.new_zeros((len(ids), k0.shape[1], cached, k0.shape[3]))
            values = v0.new_zeros((len(ids), v0.shape[1], cached, v0.shape[3]))
            for row, (pad, (entry, _)) in enumerate(zip(pads, found)):
                n = cached - pad
                if n > 0:
                    k_e, v_e = self._cache_entries[entry][1][layer]
                    keys[row, :, pad:cached] = k_e[0, :, :n]
                    values[row, :, pad:cached] = v_e[0, :, :n]
            cache.update(keys.to(self.device), values.to(self.device), layer)
        self.cached_prompt_tokens += sum(max(0, cached - pad) for pad in pads)
        return cache, cached

    def _store(self, sequences, cache, pads: list[int], scopes: list[Any]) -> None:
        """Keep each row's tokens and keys/values (padding stripped) for its next turn."""
        length = cache.get_seq_length()
        rows = sequences[:, :length].tolist()
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for row, (pad, scope) in enumerate(zip(pads, scopes)):
            tokens = rows[row][pad:length]
            kv = [(k[row:row + 1, :, pad:length].detach().to("cpu").clone(),
                   v[row:row + 1, :, pad:length].detach().to("cpu").clone()) for k, v in layers]
            # Replace the entry this conversation grew from; otherwise append (bounded, oldest out).
            idx, shared = self._lookup(tokens, scope)
            if idx >= 0 and shared == len(self._cache_entries[idx][0]):
                self._cache_entries.pop(idx)
            self._cache_entries.append((tokens, kv, scope))
        limit = max(2, 2 * self.batch_size)
        if len(self._cache_entries) > limit:
            del self._cache_entries[:len(self._cache_entries) - limit]

    def _prompt_ids(self, prompts: list[str]) -> list[list[int]]:
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        for i, seq in enumerate(ids):
            if len(seq) > self.max_prompt_tokens:
                logger.warning("prompt of %d tokens cut to the last %d", len(seq), self.max_prompt_tokens)
                ids[i] = seq[-self.max_prompt_tokens:]
        return ids

    def _text(self, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        for marker in self._end_markers:
            text = text.replace(marker, "")
        return text

    def _generate_fast(self, prompts: list[str]) -> list[str]:
        """One turn per prompt with :class:`~trace_train.tiny.fast_decode.FastDecoder`."""
        t0 = time.perf_counter()
        ids = self._prompt_ids(prompts)
        top_k = self.top_k
        if top_k is None:  # what generate() would use
            top_k = getattr(getattr(self.model, "generation_config", None), "top_k", None) or 50
        out = self.decoder.generate(ids, self.max_new_tokens, self.eos_ids, temperature=self.temperature,
                                    top_k=top_k, top_p=self.top_p)
        texts, completion_tokens = [], 0
        eos = set(self.eos_ids)
        for gen in out:
            tokens = gen.tokens[:-1] if gen.tokens and gen.tokens[-1] in eos else gen.tokens
            completion_tokens += len(tokens)
            texts.append(self._text(tokens))
        self.last_samples = [(list(gen.tokens), [float(x) for x in gen.logprobs]) for gen in out] \
            if self.record_samples else []
        self.cached_prompt_tokens += sum(gen.cached_tokens for gen in out)
        self.stats.calls += len(prompts)
        self.stats.prompt_tokens += sum(len(s) for s in ids)
        self.stats.completion_tokens += completion_tokens
        self.stats.seconds += time.perf_counter() - t0
        return texts

    def _generate(self, prompts: list[str]) -> list[str]:
        import torch

        if self.decoder is not None:
            return self._generate_fast(prompts)
        t0 = time.perf_counter()
        ids = self._prompt_ids(prompts)
        width = max(len(s) for s in ids)
        pad = self.tokenizer.pad_token_id
        pads = [width - len(seq) for seq in ids]
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, seq in enumerate(ids):
            input_ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[i, width - len(seq):] = 1
        gen_kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "eos_token_id": self.eos_ids,
                                      "pad_token_id": pad}
        if self.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
            if self.top_k is not None:
                gen_kwargs["top_k"] = self.top_k
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if self.record_samples:  # the processed scores: the distribution each token was drawn from
            gen_kwargs.update(return_dict_in_generate=True, output_scores=True)
        cache, scopes = None, []
        if self.prefix_cache:
            scopes = self._scopes(ids)
            cache, _ = self._batch_cache(ids, width, scopes)
            gen_kwargs.update(return_dict_in_generate=True, use_cache=True)
            if cache is not None:
                gen_kwargs[self._cache_kwarg] = cache
        with torch.inference_mode():
            try:
                output = self.model.generate(input_ids=input_ids.to(self.device),
                                             attention_mask=mask.to(self.device), **gen_kwargs)
            except ValueError as exc:  # transformers before the `cache=` rename: use `past_key_values=`
                if cache is None or self._cache_kwarg != "cache" or "cache" not in str(exc):
                    raise
                self._cache_kwarg = "past_key_values"
                gen_kwargs["past_key_values"] = gen_kwargs.pop("cache")
                output = self.model.generate(input_ids=input_ids.to(self.device),
                                             attention_mask=mask.to(self.device), **gen_kwargs)
        sequences = output.sequences if (self.prefix_cache or self.record_samples) else output
        if self.prefix_cache:
            returned = output.get("cache", None) if hasattr(output, "get") else None
            returned = returned if returned is not None else getattr(output, "past_key_values", None)
            if returned is not None:
                self._store(sequences, returned, pads, scopes)
        new = sequences[:, width:].tolist()
        texts, completion_tokens, samples = [], 0, []
        step_logps = [torch.log_softmax(s.float(), dim=-1) for s in output.scores] if self.record_samples else []
        for row, seq in enumerate(new):
            n = len(seq)
            for j, tok in enumerate(seq):
                if tok in self.eos_ids:
                    n = j
                    break
            completion_tokens += n
            texts.append(self._text(seq[:n]))
            if self.record_samples:
                kept = seq[:min(len(seq), n + 1)]  # the end token was sampled too
                samples.append((kept, [float(step_logps[j][row, tok]) for j, tok in enumerate(kept)]))
        self.last_samples = samples
        self.stats.calls += len(prompts)
        self.stats.prompt_tokens += sum(len(s) for s in ids)
        self.stats.completion_tokens += completion_tokens
        self.stats.seconds += time.perf_counter() - t0
        return texts


register_agent("openai", OpenAIChatAgent)
register_agent("hf", HFAgent)
