"""loop/llm.py against a scripted OpenAI-compatible server, through the real ``openai`` client.

No timed asserts: retries, outcomes and requested back-off delays are asserted, never durations.
Back-off sleeps are recorded and skipped (``sleep=`` hook); only the hard-limit tests wait, for
fractions of a second.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from kernforge.loop.config import ConfigError, load_config
from kernforge.loop.llm import LLMClient, LLMError, retry_after_seconds, split_reasoning

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from fake_llm import (  # noqa: E402
    BROKEN_KERNEL, CHEATING_KERNEL, GOOD_KERNEL, Reply, dropped, error, fake_llm, fenced, reply, slow,
)

KEY = "sk-fake-9d2b7c41e0"
MESSAGES = [{"role": "system", "content": "rules"}, {"role": "user", "content": "write rms_norm"}]
__all__ = ["fake_llm"]  # the fixture, imported for pytest


def make_config(server, tmp_path, **overrides):
    env = {"KERNFORGE_API_KEY": KEY, "XDG_CONFIG_HOME": str(tmp_path)}
    settings = {"request_timeout_s": 10, "max_retries": 3, "backoff_base_s": 0.5}
    settings.update(overrides)
    model = settings.pop("model", "fake-model")
    provider = settings.pop("provider", "custom")
    return load_config(provider=provider, base_url=server.base_url, model=model, env=env, **settings)


class Sleeps:
    """Records the back-off delays asked for and returns at once."""

    def __init__(self):
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


def propose(config, messages=MESSAGES, sleeps=None, **kw):
    async def go():
        async with LLMClient(config, sleep=sleeps or Sleeps()) as client:
            return await client.propose(messages, **kw)

    return asyncio.run(go())


# ---- replies -----------------------------------------------------------------------------------


def test_good_kernel_is_extracted_and_accounted(fake_llm, tmp_path):
    fake_llm.script = [reply(fenced(GOOD_KERNEL), prompt_tokens=1200, completion_tokens=800)]
    config = make_config(fake_llm, tmp_path, model="MiniMax-M3")
    c = propose(config)
    assert c.code == GOOD_KERNEL and c.code_kind == "ok" and c.summary.startswith("Row-wise RMSNorm")
    assert (c.tokens_in, c.tokens_out, c.usage_estimated) == (1200, 800, False)
    assert c.cost == pytest.approx((1200 * 0.60 + 800 * 2.40) / 1e6)
    assert (c.retries, c.finish_reason, c.truncated, c.model) == (0, "stop", False, "MiniMax-M3")
    assert c.latency_s > 0
    body = fake_llm.completions[0].body
    assert body["model"] == "MiniMax-M3" and body["messages"] == MESSAGES
    assert body["max_completion_tokens"] == config.max_output_tokens


def test_preset_request_parameters_reach_the_server(fake_llm, tmp_path):
    fake_llm.script = [reply(fenced(GOOD_KERNEL))]
    config = make_config(fake_llm, tmp_path, provider="minimax")
    propose(config, max_output_tokens=1000)
    body = fake_llm.completions[0].body
    assert body["reasoning_split"] is True and body["temperature"] == 1.0 and body["max_completion_tokens"] == 1000
    together = make_config(fake_llm, tmp_path, provider="together")
    fake_llm.script = [reply(fenced(GOOD_KERNEL))]
    propose(together)
    assert "max_tokens" in fake_llm.completions[1].body and "reasoning_split" not in fake_llm.completions[1].body


@pytest.mark.parametrize("code, kind", [(BROKEN_KERNEL, "syntax_error"), (CHEATING_KERNEL, "ok")])
def test_broken_and_cheating_code_is_passed_on_for_the_verifier(fake_llm, tmp_path, code, kind):
    # Judging is the verifier's job: the proposer returns what the model wrote, labelled.
    fake_llm.script = [reply(fenced(code))]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.code == code and c.code_kind == kind


def test_think_block_is_reasoning_not_answer(fake_llm, tmp_path):
    draft = fenced(CHEATING_KERNEL, before="Maybe just call torch:")
    content = f"<think>Let me plan.\n{draft}\nNo, that cheats.</think>\n\nFinal answer:\n{fenced(GOOD_KERNEL)}"
    fake_llm.script = [reply(content)]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.code == GOOD_KERNEL and "Let me plan." in c.reasoning and "No, that cheats." in c.reasoning
    assert "<think>" not in c.text and "Let me plan" not in c.text


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_fields(fake_llm, tmp_path, field):
    fake_llm.script = [Reply(content=fenced(GOOD_KERNEL), **{field: "thought about tiling"})]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.reasoning == "thought about tiling" and c.code == GOOD_KERNEL


def test_minimax_reasoning_details(fake_llm, tmp_path):
    details = [{"type": "reasoning.text", "text": "first"}, {"type": "reasoning.text", "text": "second"}]
    fake_llm.script = [Reply(content=fenced(GOOD_KERNEL), reasoning_details=details, reasoning_tokens=40)]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.reasoning == "first\n\nsecond" and c.reasoning_tokens == 40


def test_truncated_reply_reports_and_gives_no_partial_code(fake_llm, tmp_path):
    cut = "Plan.\n```python\n" + GOOD_KERNEL[:300]
    fake_llm.script = [reply(cut, finish_reason="length", completion_tokens=32768)]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.truncated and c.code is None and c.code_kind == "truncated" and c.tokens_out == 32768


def test_truncated_while_thinking(fake_llm, tmp_path):
    fake_llm.script = [reply("<think>tiling, then " + "more thought " * 50, finish_reason="length")]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.truncated and c.code is None and c.text == "" and c.reasoning.startswith("tiling")


def test_truncated_after_a_complete_module_keeps_it(fake_llm, tmp_path):
    fake_llm.script = [reply(fenced(GOOD_KERNEL) + "\nTuning notes:\n```python\nBLOCK = ", finish_reason="length")]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.truncated and c.code == GOOD_KERNEL


def test_missing_usage_is_estimated(fake_llm, tmp_path):
    fake_llm.script = [Reply(content=fenced(GOOD_KERNEL), prompt_tokens=False)]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.usage_estimated and c.tokens_out == len(fenced(GOOD_KERNEL)) // 4 and c.tokens_in > 0


def test_unpriced_model_has_unknown_cost(fake_llm, tmp_path):
    fake_llm.script = [reply(fenced(GOOD_KERNEL))]
    assert propose(make_config(fake_llm, tmp_path, model="no-such-price")).cost is None


def test_model_is_asked_from_the_server_when_not_configured(fake_llm, tmp_path):
    fake_llm.models = ["served-model"]
    fake_llm.script = [reply(fenced(GOOD_KERNEL))]
    config = make_config(fake_llm, tmp_path, model=None, provider="local")
    assert config.model == "" and config.price() is not None  # local: free
    c = propose(config)
    assert c.model == "served-model" and c.cost == 0.0
    assert [r.path for r in fake_llm.requests] == ["/v1/models", "/v1/chat/completions"]
    assert fake_llm.completions[0].body["model"] == "served-model"


# ---- retries -----------------------------------------------------------------------------------


def test_429_respects_retry_after(fake_llm, tmp_path):
    fake_llm.script = [error(429, retry_after=7), reply(fenced(GOOD_KERNEL))]
    sleeps = Sleeps()
    c = propose(make_config(fake_llm, tmp_path), sleeps=sleeps)
    assert c.retries == 1 and c.code == GOOD_KERNEL and len(fake_llm.completions) == 2
    assert 7 <= sleeps.delays[0] <= 7 + 0.5  # Retry-After is a floor, plus at most backoff_base_s of jitter


@pytest.mark.parametrize("status", [500, 502, 503, 408])
def test_server_errors_are_retried(fake_llm, tmp_path, status):
    fake_llm.script = [error(status), error(status), reply(fenced(GOOD_KERNEL))]
    sleeps = Sleeps()
    c = propose(make_config(fake_llm, tmp_path), sleeps=sleeps)
    assert c.retries == 2 and c.code == GOOD_KERNEL
    # Exponential back-off with full jitter: each delay within its doubling cap.
    assert 0 <= sleeps.delays[0] <= 0.5 and 0 <= sleeps.delays[1] <= 1.0


def test_gives_up_after_max_retries(fake_llm, tmp_path):
    fake_llm.script = [error(500)] * 5
    with pytest.raises(LLMError) as info:
        propose(make_config(fake_llm, tmp_path, max_retries=2))
    err = info.value
    assert (err.kind, err.retries, err.status, err.fatal) == ("server_error", 2, 500, False)
    assert "gave up after 2 retries" in str(err) and len(fake_llm.completions) == 3


def test_backoff_is_capped(fake_llm, tmp_path):
    fake_llm.script = [error(503)] * 6 + [reply(fenced(GOOD_KERNEL))]
    sleeps = Sleeps()
    propose(make_config(fake_llm, tmp_path, max_retries=6, backoff_base_s=1, backoff_max_s=3), sleeps=sleeps)
    assert len(sleeps.delays) == 6 and max(sleeps.delays) <= 3


def test_retry_after_beyond_the_limit_is_not_waited_for(fake_llm, tmp_path):
    fake_llm.script = [error(429, retry_after=3600)]
    sleeps = Sleeps()
    with pytest.raises(LLMError, match="asks to wait 3600 s") as info:
        propose(make_config(fake_llm, tmp_path, max_retry_after_s=60), sleeps=sleeps)
    assert info.value.kind == "rate_limited" and sleeps.delays == []


@pytest.mark.parametrize("status, kind, fatal", [(401, "auth", True), (403, "auth", True), (404, "not_found", True), (400, "bad_request", False), (422, "bad_request", False)])
def test_client_errors_are_not_retried(fake_llm, tmp_path, status, kind, fatal):
    fake_llm.script = [error(status, message="nope")]
    with pytest.raises(LLMError) as info:
        propose(make_config(fake_llm, tmp_path))
    assert (info.value.kind, info.value.fatal, info.value.retries) == (kind, fatal, 0)
    assert len(fake_llm.completions) == 1


def test_exhausted_quota_is_fatal_not_retried(fake_llm, tmp_path):
    fake_llm.script = [error(429, code="insufficient_quota", message="You exceeded your current quota")]
    with pytest.raises(LLMError) as info:
        propose(make_config(fake_llm, tmp_path))
    assert info.value.kind == "quota" and info.value.fatal and len(fake_llm.completions) == 1


def test_dropped_connection_is_retried(fake_llm, tmp_path):
    fake_llm.script = [dropped(), reply(fenced(GOOD_KERNEL))]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.retries == 1 and c.code == GOOD_KERNEL


def test_malformed_reply_is_retried(fake_llm, tmp_path):
    fake_llm.script = [Reply(raw_body=b'{"id": "x", "object": "chat.completion", "choices": []}'), reply(fenced(GOOD_KERNEL))]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.retries == 1 and c.code == GOOD_KERNEL


def test_slow_server_hits_the_hard_limit_then_recovers(fake_llm, tmp_path):
    # The limit leaves a loaded machine time for the good reply; the slow one would take 30 s.
    fake_llm.script = [slow(30, reply(fenced(GOOD_KERNEL))), reply(fenced(GOOD_KERNEL))]
    c = propose(make_config(fake_llm, tmp_path, request_timeout_s=1.5))
    assert c.retries == 1 and c.code == GOOD_KERNEL and len(fake_llm.completions) == 2


def test_slow_server_every_time_fails_with_timeout(fake_llm, tmp_path):
    fake_llm.script = [slow(30)] * 3
    with pytest.raises(LLMError) as info:
        propose(make_config(fake_llm, tmp_path, request_timeout_s=0.3, max_retries=1))
    assert info.value.kind == "timeout" and info.value.retries == 1 and len(fake_llm.completions) == 2


def test_total_deadline_stops_retrying(fake_llm, tmp_path):
    fake_llm.script = [error(503, retry_after=5)] * 3
    with pytest.raises(LLMError) as info:
        propose(make_config(fake_llm, tmp_path, total_timeout_s=2))
    assert info.value.kind == "deadline" and len(fake_llm.completions) == 1


def test_concurrency_limit(fake_llm, tmp_path):
    fake_llm.script = [slow(0.5, reply(fenced(GOOD_KERNEL))) for _ in range(4)]
    config = make_config(fake_llm, tmp_path, concurrency=2)

    async def go():
        async with LLMClient(config) as client:
            return await asyncio.gather(*(client.propose(MESSAGES) for _ in range(4)))

    results = asyncio.run(go())
    assert all(r.code == GOOD_KERNEL for r in results)
    # Four requests, each held 0.5 s by the server: two at a time, never more.
    assert fake_llm.max_in_flight == 2 and len(fake_llm.completions) == 4


# ---- the key -----------------------------------------------------------------------------------


def test_key_only_in_the_authorization_header(fake_llm, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    fake_llm.script = [error(500, message=f"echo Bearer {KEY}"), reply(fenced(GOOD_KERNEL))]
    config = make_config(fake_llm, tmp_path)

    async def go():
        async with LLMClient(config, sleep=Sleeps()) as client:
            return repr(client), await client.propose(MESSAGES)

    client_repr, completion = asyncio.run(go())
    fake_llm.script = [error(401, message=f"bad key {KEY}")]
    with pytest.raises(LLMError) as info:
        propose(config)
    for request in fake_llm.requests:
        auth = {k.lower(): v for k, v in request.headers.items()}["authorization"]
        assert auth == f"Bearer {KEY}"
        others = {k: v for k, v in request.headers.items() if k.lower() != "authorization"}
        assert KEY not in str(others) and KEY.encode() not in request.raw
    assert KEY not in str(completion.to_dict()) and KEY not in client_repr
    assert KEY not in str(info.value) and "***" in str(info.value)
    assert KEY not in caplog.text


def test_keyless_endpoint_never_borrows_the_openai_key(fake_llm, tmp_path, monkeypatch):
    # Given no key, the SDK would read OPENAI_API_KEY and send it to whatever server this is.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-must-not-leak")
    config = load_config(provider="local", base_url=fake_llm.base_url, model="m", env={"XDG_CONFIG_HOME": str(tmp_path)})
    fake_llm.script = [reply(fenced(GOOD_KERNEL))]
    propose(config)
    assert "sk-openai-must-not-leak" not in fake_llm.everything_received()
    assert {k.lower(): v for k, v in fake_llm.requests[0].headers.items()}["authorization"] == "Bearer EMPTY"


def test_a_provider_that_needs_a_key_refuses_to_start_without_one(tmp_path):
    config = load_config(provider="minimax", env={"XDG_CONFIG_HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match="no API key for minimax"):
        LLMClient(config)


# ---- pieces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, answer, reasoning", [
    ("plain answer", "plain answer", ""),
    ("<think>a</think>answer", "answer", "a"),
    ("<think>a</think>x<think>b</think>y", "xy", "a\n\nb"),
    ("<THINKING>a</THINKING> answer", "answer", "a"),
    ("answer <think>cut off mid", "answer", "cut off mid"),
    ("thought only in the template</think>\nanswer", "answer", "thought only in the template"),
])
def test_split_reasoning(content, answer, reasoning):
    assert split_reasoning(content) == (answer, reasoning)


@pytest.mark.parametrize("headers, seconds", [
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after": "soon"}, None),
    ({}, None),
])
def test_retry_after_seconds(headers, seconds):
    assert retry_after_seconds(headers) == seconds


def test_retry_after_http_date():
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past


@pytest.mark.parametrize("prompt_tokens", [-10**9, 10**12], ids=["negative", "absurd"])
def test_usage_no_request_can_have_is_estimated_instead(fake_llm, tmp_path, prompt_tokens):
    """Red team: a server's negative count ran a --max-tokens 5000 run 10,500 tokens over and showed
    -999,989,000 tokens; a priced model would have had a negative cost past --max-cost."""
    fake_llm.script = [Reply(content=fenced(GOOD_KERNEL), prompt_tokens=prompt_tokens)]
    c = propose(make_config(fake_llm, tmp_path))
    assert c.usage_estimated and 0 < c.tokens_in < 10**6 and c.tokens_out == len(fenced(GOOD_KERNEL)) // 4
