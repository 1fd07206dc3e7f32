"""The LLM proposer: one chat completion per call, against any OpenAI-compatible endpoint.

The interface the loop uses is ``Proposer.propose(messages) -> Completion``. ``LLMClient`` is the
implementation on ``openai.AsyncOpenAI``. It owns retrying (the SDK's own retries are off, so
every retry is counted and bounded here), a hard wall-clock limit per attempt (``asyncio.wait_for``
around the whole HTTP call: an HTTP read timeout restarts on every byte, so a server trickling a
reply could otherwise hold a request for ever), a concurrency limit, and the accounting of tokens,
cost and latency. Reasoning is separated from the answer and the candidate module extracted.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import re
import time
from dataclasses import dataclass, fields
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

import openai

from .config import ConfigError, LLMConfig, needs_key
from .extract import extract_code

log = logging.getLogger("kernforge.llm")

Message = Mapping[str, str]


@dataclass(frozen=True)
class Completion:
    """One model reply, accounted for. ``code`` is None when there is no usable module (see ``note``)."""

    text: str
    reasoning: str
    code: str | None
    #: what extraction found or why there is no code
    note: str
    #: extract.Extraction.kind: ok, no_code, no_model_new, truncated, syntax_error
    code_kind: str
    summary: str
    model: str
    tokens_in: int
    tokens_out: int
    reasoning_tokens: int | None
    #: the server sent no usage: tokens estimated at 4 characters each
    usage_estimated: bool
    #: USD; None when the model has no price in the table
    cost: float | None
    #: seconds from the call to the reply, retries and back-off included
    latency_s: float
    retries: int
    finish_reason: str | None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: more tokens than any request or reply of any model has: a count beyond it is not believed
MAX_TOKENS_PER_REQUEST = 10_000_000


def _token_count(value: Any) -> bool:
    """Whether a server's usage figure is a count a request can have."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS_PER_REQUEST


class Proposer(Protocol):
    """What the loop calls for an LLM proposal (LLMClient; a test double can stand in).

    The offline tuner (offline.py) works on source text, not messages, and has its own interface.
    """

    async def propose(self, messages: Sequence[Message]) -> Completion: ...


class LLMError(Exception):
    """No reply. ``fatal``: no later request can succeed either (bad key, no quota, unknown model)."""

    def __init__(self, kind: str, message: str, *, retries: int = 0, status: int | None = None,
                 fatal: bool = False, latency_s: float = 0.0) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.retries = retries
        self.status = status
        self.fatal = fatal
        self.latency_s = latency_s


@dataclass(frozen=True)
class _Failure:
    kind: str
    message: str
    retryable: bool
    status: int | None = None
    fatal: bool = False
    retry_after: float | None = None


_THINK_BLOCK = re.compile(r"<(think|thinking)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<(think|thinking)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(think|thinking)>", re.IGNORECASE)


def split_reasoning(content: str) -> tuple[str, str]:
    """(answer, reasoning) from content that may inline its thinking in <think> tags."""
    parts = [m.group(2).strip() for m in _THINK_BLOCK.finditer(content)]
    rest = _THINK_BLOCK.sub("", content)
    opened = _THINK_OPEN.search(rest)
    if opened:  # cut off while thinking: everything after the tag is thought, not answer
        parts.append(rest[opened.end():].strip())
        rest = rest[:opened.start()]
    closes = list(_THINK_CLOSE.finditer(rest))
    if closes:  # the chat template put the opening tag in the prompt, so only the close shows
        parts.insert(0, rest[:closes[-1].start()].strip())
        rest = rest[closes[-1].end():]
    return rest.strip(), "\n\n".join(p for p in parts if p)


def _field_reasoning(message: Any) -> str:
    """Reasoning a server returns beside the content (vLLM/SGLang, DeepSeek, MiniMax split mode)."""
    for name in ("reasoning_content", "reasoning"):
        value = getattr(message, name, None)
        if isinstance(value, str) and value.strip():
            return value.strip()
    details = getattr(message, "reasoning_details", None)
    if isinstance(details, list):
        texts = [d.get("text", "") for d in details if isinstance(d, Mapping)]
        return "\n\n".join(t.strip() for t in texts if isinstance(t, str) and t.strip())
    return ""


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait (Retry-After as seconds or a date, or retry-after-ms)."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _classify(err: openai.APIStatusError) -> _Failure:
    status = err.status_code
    text = f"HTTP {status}: {err.message}"
    wait = retry_after_seconds(err.response.headers if err.response is not None else None)
    if status == 429:
        if err.code == "insufficient_quota":  # billing, not load: waiting will not help
            return _Failure("quota", text, False, status, fatal=True)
        return _Failure("rate_limited", text, True, status, retry_after=wait)
    if status in (401, 403):
        return _Failure("auth", text + " (check the API key and provider)", False, status, fatal=True)
    if status == 404:
        return _Failure("not_found", text + " (check --model and --base-url)", False, status, fatal=True)
    if status in (408, 409) or status >= 500:
        return _Failure("server_error", text, True, status, retry_after=wait)
    # 400/413/422: this request cannot succeed (prompt too long, bad parameter); others may.
    return _Failure("bad_request", text, False, status)


class LLMClient:
    """``Proposer`` on an OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if config.api_key is None and needs_key(config):
            raise ConfigError(
                f"no API key for {config.provider}: set KERNFORGE_API_KEY (or the provider's usual "
                f"variable), or [keys] {config.provider} in the config file"
            )
        self.config = config
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(config.concurrency)
        self._model: str | None = config.model or None
        # Always an explicit key: given None, the SDK reads OPENAI_API_KEY from the environment
        # and would send an OpenAI key to a local or third-party server. vLLM's placeholder is "EMPTY".
        self._secret = config.api_key.reveal() if config.api_key is not None else ""
        # Plain http (a local vLLM/SGLang server) has no TLS: skip loading the CA bundle, which
        # costs a few hundred milliseconds per client.
        plain = config.base_url.startswith("http://")
        self._client = openai.AsyncOpenAI(
            api_key=self._secret or "EMPTY",
            base_url=config.base_url,
            max_retries=0,
            timeout=openai.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
            http_client=openai.DefaultAsyncHttpxClient(verify=False) if plain else None,
        )

    def __repr__(self) -> str:
        return f"LLMClient(provider={self.config.provider!r}, base_url={self.config.base_url!r}, model={self._model!r})"

    async def __aenter__(self) -> "LLMClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.close()

    def _clean(self, text: str) -> str:
        # Belt and braces: a server or proxy echoing the Authorization header into an error body
        # must not carry the key into our messages, logs or the archive.
        return text.replace(self._secret, "***") if self._secret else text

    async def resolve_model(self) -> str:
        """The configured model, or the first one the server lists (local servers serve one)."""
        if self._model:
            return self._model
        try:
            page = await asyncio.wait_for(self._client.models.list(), self.config.request_timeout_s)
        except (asyncio.TimeoutError, openai.APIError) as err:
            raise LLMError("no_model", self._clean(f"no --model given and {self.config.base_url}/models did not answer: {err}"), fatal=True) from None
        ids = [m.id for m in page.data]
        if not ids:
            raise LLMError("no_model", f"no --model given and {self.config.base_url}/models lists none", fatal=True)
        self._model = ids[0]
        return self._model

    async def propose(
        self,
        messages: Sequence[Message],
        *,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
    ) -> Completion:
        """One reply to ``messages``, retried on 429, 5xx, timeouts and dropped connections."""
        model = await self.resolve_model()
        cfg = self.config
        started = time.monotonic()
        budget = cfg.total_timeout_s or (cfg.max_retries + 1) * (cfg.request_timeout_s + cfg.backoff_max_s)
        deadline = started + budget
        retries = 0
        while True:
            limit = min(cfg.request_timeout_s, deadline - time.monotonic())
            if limit <= 0:
                raise LLMError("deadline", f"no reply within the {budget:g} s allowed for this request", retries=retries, latency_s=time.monotonic() - started)
            try:
                async with self._semaphore:
                    response = await asyncio.wait_for(
                        self._create(model, messages, max_output_tokens, temperature), timeout=limit
                    )
                return self._completion(model, messages, response, retries, time.monotonic() - started)
            except asyncio.TimeoutError:
                failure = _Failure("timeout", f"no complete reply within the hard limit of {limit:g} s", True)
            except openai.APITimeoutError:
                failure = _Failure("timeout", "the HTTP client timed out", True)
            except openai.APIConnectionError as err:
                failure = _Failure("connection", f"connection failed: {err.message}", True)
            except openai.APIStatusError as err:
                failure = _classify(err)
            except _BadResponse as err:
                failure = _Failure("bad_response", str(err), True)
            elapsed = time.monotonic() - started
            message = self._clean(failure.message)
            if not failure.retryable:
                raise LLMError(failure.kind, message, retries=retries, status=failure.status, fatal=failure.fatal, latency_s=elapsed)
            if retries >= cfg.max_retries:
                raise LLMError(failure.kind, f"{message}; gave up after {retries} retries", retries=retries, status=failure.status, latency_s=elapsed)
            if failure.retry_after is not None and failure.retry_after > cfg.max_retry_after_s:
                raise LLMError(failure.kind, f"{message}; the server asks to wait {failure.retry_after:g} s, more than max_retry_after_s={cfg.max_retry_after_s:g}", retries=retries, status=failure.status, latency_s=elapsed)
            delay = self._backoff(retries, failure.retry_after)
            if time.monotonic() + delay >= deadline:
                raise LLMError("deadline", f"{message}; no time left to retry within {budget:g} s", retries=retries, status=failure.status, latency_s=elapsed)
            log.info("LLM request failed (%s); retry %d in %.2f s", failure.kind, retries + 1, delay)
            await self._sleep(delay)
            retries += 1

    def _backoff(self, retries: int, retry_after: float | None) -> float:
        """Exponential back-off with full jitter; a server's Retry-After is a floor, not a hint."""
        if retry_after is not None:
            # Small jitter on top so clients told the same instant do not all return at once.
            return retry_after + self._rng.uniform(0, self.config.backoff_base_s)
        return self._rng.uniform(0, min(self.config.backoff_max_s, self.config.backoff_base_s * 2**retries))

    async def _create(self, model: str, messages: Sequence[Message], max_output_tokens: int | None,
                      temperature: float | None) -> Any:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in messages],
            self.config.max_tokens_param: max_output_tokens or self.config.max_output_tokens,
        }
        temperature = self.config.temperature if temperature is None else temperature
        if temperature is not None:
            kwargs["temperature"] = temperature
        if self.config.extra_body:
            kwargs["extra_body"] = dict(self.config.extra_body)
        return await self._client.chat.completions.create(**kwargs)

    def _completion(self, model: str, messages: Sequence[Message], response: Any, retries: int,
                    latency: float) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise _BadResponse("the reply has no choices (malformed response)")
        choice = choices[0]
        message = choice.message
        text, inline = split_reasoning(message.content or "")
        reasoning = "\n\n".join(p for p in (_field_reasoning(message), inline) if p)
        finish = choice.finish_reason
        extraction = extract_code(text, truncated=finish == "length")
        usage = getattr(response, "usage", None)
        said = (getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))
        if all(_token_count(n) for n in said):
            tokens_in, tokens_out, estimated = int(said[0]), int(said[1]), False
            details = getattr(usage, "completion_tokens_details", None)
            counted = getattr(details, "reasoning_tokens", None) if details else None
            reasoning_tokens = int(counted) if _token_count(counted) else None
        else:
            # none, or counts no request has (negative, fractional, absurd: a server's word that
            # would have lifted --max-tokens and --max-cost), so the estimate stands in
            # Budgets need a number; 4 characters a token is the usual rule for English and code.
            tokens_in = sum(len(m.get("content", "")) for m in messages) // 4
            tokens_out = (len(message.content or "") + len(_field_reasoning(message))) // 4
            estimated, reasoning_tokens = True, None
        price = self.config.price(model)
        return Completion(
            text=text,
            reasoning=reasoning,
            code=extraction.code,
            note=extraction.note,
            code_kind=extraction.kind,
            summary=extraction.summary,
            model=model,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            reasoning_tokens=reasoning_tokens,
            usage_estimated=estimated,
            cost=price.cost(tokens_in, tokens_out) if price is not None else None,
            latency_s=latency,
            retries=retries,
            finish_reason=finish,
        )


class _BadResponse(Exception):
    """A 200 reply without a usable message (some proxies answer errors this way)."""
