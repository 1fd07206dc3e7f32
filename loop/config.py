"""LLM configuration: loaded once into a frozen ``LLMConfig`` and passed down; never mutated.

Precedence, highest first: arguments (the CLI's ``--provider``/``--base-url``/``--model`` and
tunables), environment (``KERNFORGE_PROVIDER``, ``KERNFORGE_BASE_URL``, ``KERNFORGE_MODEL``), the
config file's ``[llm]`` table, the provider preset.

The API key comes from ``KERNFORGE_API_KEY``, then the provider's usual variable, then the config
file (``[keys] <provider> = "..."`` or ``[llm] api_key``). It is held in a ``Secret`` whose repr is
``***`` and which refuses to be pickled, so it cannot reach a log line, the archive (``to_dict``
leaves it out) or a sandbox job (jobs are pickled or serialised). There is deliberately no
command-line option for the key: command lines end up in shell history and ``ps``.

Config file (``~/.config/kernforge/config.toml``, or ``$KERNFORGE_CONFIG``)::

    [llm]
    provider = "minimax"          # minimax, minimax-cn, together, openai, local
    model = "MiniMax-M3"
    concurrency = 8
    request_timeout_s = 600

    [keys]
    minimax = "..."

    [prices."MiniMax-M3"]         # USD per million tokens
    input = 0.60
    output = 2.40
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib


class ConfigError(RuntimeError):
    """A configuration that cannot be used: names the file or variable and what is wrong.

    A RuntimeError so that ``kernforge doctor``, which reports RuntimeErrors as failed checks,
    prints the reason instead of a traceback.
    """


class Secret:
    """A credential. Shows as ``***`` everywhere; ``reveal()`` is the only way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        object.__setattr__(self, "_value", value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "***"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Secret is immutable")

    def __reduce__(self):
        # Pickling is how objects cross into worker processes; a key must never cross.
        raise TypeError("an API key is never pickled (it must not leave the trusted process)")

    def __copy__(self) -> "Secret":
        return self

    def __deepcopy__(self, memo: Any) -> "Secret":
        return self


@dataclass(frozen=True)
class Price:
    """USD per million input (prompt) and output (completion, reasoning included) tokens."""

    input: float
    output: float

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input + tokens_out * self.output) / 1e6


@dataclass(frozen=True)
class Preset:
    name: str
    base_url: str
    model: str
    #: environment variables holding this provider's key, after KERNFORGE_API_KEY
    key_env: tuple[str, ...] = ()
    #: a key is required (a local server usually takes none)
    needs_key: bool = True
    #: self-hosted: tokens cost nothing unless the price table says otherwise
    free: bool = False
    #: "max_completion_tokens" (OpenAI's current name; MiniMax marks max_tokens deprecated) or "max_tokens"
    max_tokens_param: str = "max_completion_tokens"
    temperature: float | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)


# Facts below were looked up on 2026 documentation pages; those marked "unconfirmed" could not be
# checked against the provider's own pages and should be verified before relying on them.
PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        # MiniMax's own OpenAI-SDK page (platform.minimax.io/docs/api-reference/text-openai-api):
        # base URL https://api.minimax.io/v1, model "MiniMax-M3". By default M3 inlines its thinking
        # in the content as <think>...</think>; reasoning_split=True moves it to a separate field
        # (reasoning_details / reasoning_content), which keeps the content clean. MiniMax recommends
        # temperature 1.0.
        "minimax": Preset(
            "minimax", "https://api.minimax.io/v1", "MiniMax-M3", ("MINIMAX_API_KEY",),
            temperature=1.0, extra_body=MappingProxyType({"reasoning_split": True}),
        ),
        # MiniMax's mainland-China endpoint (seen in third-party integrations; unconfirmed on
        # MiniMax's own pages).
        "minimax-cn": Preset(
            "minimax-cn", "https://api.minimaxi.com/v1", "MiniMax-M3", ("MINIMAX_API_KEY",),
            temperature=1.0, extra_body=MappingProxyType({"reasoning_split": True}),
        ),
        # docs.together.ai (OpenAI compatibility page): base URL https://api.together.ai/v1.
        # The M3 model id there is unconfirmed: Together names models by their Hugging Face id,
        # and M3's is MiniMaxAI/MiniMax-M3.
        "together": Preset(
            "together", "https://api.together.ai/v1", "MiniMaxAI/MiniMax-M3", ("TOGETHER_API_KEY",),
            max_tokens_param="max_tokens",
        ),
        "openai": Preset("openai", "https://api.openai.com/v1", "gpt-5", ("OPENAI_API_KEY",)),
        # vLLM and SGLang serve the OpenAI API on port 8000 under /v1; an empty model means "ask the
        # server" (GET /v1/models), since it serves whatever it was started with.
        "local": Preset(
            "local", "http://localhost:8000/v1", "", (), needs_key=False, free=True,
            max_tokens_param="max_tokens",
        ),
    }
)

DEFAULT_PROVIDER = "minimax"

#: Every variable a key may be read from; a sandbox's environment must hold none of them.
KEY_ENV_VARS: tuple[str, ...] = ("KERNFORGE_API_KEY",) + tuple(
    sorted({v for p in PRESETS.values() for v in p.key_env})
)

#: USD per million tokens. MiniMax-M3: list price from third-party reports of MiniMax's price
#: page (a 50% launch discount, 0.30/1.20, was temporary). gpt-5: as reported by third-party
#: price tables. Override or extend in the config file's [prices] table.
DEFAULT_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        "MiniMax-M3": Price(input=0.60, output=2.40),
        "gpt-5": Price(input=1.25, output=10.0),
    }
)


@dataclass(frozen=True)
class LLMConfig:
    provider: str
    base_url: str
    #: empty: ask the server which model it serves (see llm.LLMClient.resolve_model)
    model: str
    api_key: Secret | None = field(default=None, repr=False, compare=False)
    #: where the key came from ("KERNFORGE_API_KEY", a file path, ...), None without a key
    key_source: str | None = None
    #: hard wall-clock limit on one HTTP attempt, enforced by asyncio around the whole call
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    #: limit on one propose() including its retries and back-off; None: attempts x limit
    total_timeout_s: float | None = None
    max_retries: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    #: a Retry-After longer than this is not waited for: the request fails instead
    max_retry_after_s: float = 300.0
    concurrency: int = 8
    max_output_tokens: int = 32768
    temperature: float | None = None
    max_tokens_param: str = "max_completion_tokens"
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    prices: Mapping[str, Price] = field(default_factory=lambda: DEFAULT_PRICES)
    free: bool = False
    #: the config file read, if any (for messages)
    config_path: str | None = None

    def __deepcopy__(self, memo: Any) -> "LLMConfig":
        return self  # immutable all the way down (read-only mappings, a Secret)

    def price(self, model: str | None = None) -> Price | None:
        """The price of ``model`` (default: the configured one); None when unknown."""
        name = model or self.model
        if name in self.prices:
            return self.prices[name]
        lowered = {k.lower(): v for k, v in self.prices.items()}
        if name.lower() in lowered:
            return lowered[name.lower()]
        return Price(0.0, 0.0) if self.free else None

    def to_dict(self) -> dict[str, Any]:
        """Everything but the key: what a run records in the archive."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "api_key":
                continue
            value = getattr(self, f.name)
            if f.name == "prices":
                value = {k: {"input": p.input, "output": p.output} for k, p in value.items()}
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        out["has_key"] = self.api_key is not None
        return out


#: Settings the config file's [llm] table and load_config(**overrides) may set, with their types.
TUNABLES: Mapping[str, type] = MappingProxyType(
    {
        "request_timeout_s": float,
        "connect_timeout_s": float,
        "total_timeout_s": float,
        "max_retries": int,
        "backoff_base_s": float,
        "backoff_max_s": float,
        "max_retry_after_s": float,
        "concurrency": int,
        "max_output_tokens": int,
        "temperature": float,
    }
)
_FILE_LLM_KEYS = {"provider", "base_url", "model", "api_key"} | set(TUNABLES)


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("KERNFORGE_CONFIG"):
        return Path(env["KERNFORGE_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "kernforge" / "config.toml"


def read_config_file(env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], Path | None]:
    """The parsed file and its path; ({}, None) when the default file does not exist."""
    env = os.environ if env is None else env
    path = config_path(env)
    try:
        exists = path.exists()
    except OSError as err:  # a folder on the way that this user may not look into
        raise ConfigError(f"cannot look for the config file {path} ({err.strerror}); set XDG_CONFIG_HOME or "
                          "KERNFORGE_CONFIG to a folder or file this user can read") from None
    if not exists:
        if env.get("KERNFORGE_CONFIG"):
            raise ConfigError(f"KERNFORGE_CONFIG names {path}, which does not exist")
        return {}, None
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    unknown = set(data) - {"llm", "keys", "prices"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {sorted(unknown)}; known: llm, keys, prices")
    llm = data.get("llm", {})
    if not isinstance(llm, dict) or set(llm) - _FILE_LLM_KEYS:
        bad = sorted(set(llm) - _FILE_LLM_KEYS) if isinstance(llm, dict) else "[llm] is not a table"
        raise ConfigError(f"{path}: unknown [llm] setting(s) {bad}; known: {sorted(_FILE_LLM_KEYS)}")
    for name in ("provider", "base_url", "model", "api_key"):
        if name in llm and not isinstance(llm[name], str):
            raise ConfigError(f"{path}: [llm] {name} must be a string")
    if not isinstance(data.get("keys", {}), dict) or not isinstance(data.get("prices", {}), dict):
        raise ConfigError(f"{path}: [keys] and [prices] must be tables")
    return data, path


def _find_key(preset: Preset, custom: bool, env: Mapping[str, str], data: Mapping[str, Any],
              path: Path | None) -> tuple[Secret | None, str | None]:
    # A custom base URL gets only the generic variable: a provider's own key must not be sent
    # to some other server just because it is in the environment.
    names = ("KERNFORGE_API_KEY",) + (() if custom else preset.key_env)
    for name in names:
        if env.get(name, "").strip():
            return Secret(env[name].strip()), name
    keys = data.get("keys", {})
    if isinstance(keys, Mapping) and isinstance(keys.get(preset.name), str) and keys[preset.name].strip():
        return Secret(keys[preset.name].strip()), f"{path} [keys] {preset.name}"
    generic = data.get("llm", {}).get("api_key")
    if isinstance(generic, str) and generic.strip():
        return Secret(generic.strip()), f"{path} [llm] api_key"
    return None, None


def _preset_for(provider: str | None, base_url: str | None) -> tuple[Preset, bool]:
    """The preset and whether the endpoint is custom (a base URL no preset has)."""
    if provider is not None:
        if provider == "custom":
            return Preset("custom", base_url or "", "", (), needs_key=False), True
        if provider not in PRESETS:
            raise ConfigError(f"unknown provider {provider!r}; known: {', '.join(PRESETS)}, custom")
        preset = PRESETS[provider]
        return preset, bool(base_url) and base_url.rstrip("/") != preset.base_url
    if base_url:
        for preset in PRESETS.values():
            if base_url.rstrip("/") == preset.base_url:
                return preset, False
        return Preset("custom", base_url, "", (), needs_key=False), True
    return PRESETS[DEFAULT_PROVIDER], False


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = TUNABLES[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {name} must be a number, not {value!r}")
    if kind is int and not float(value).is_integer():
        raise ConfigError(f"{source}: {name} must be a whole number, not {value!r}")
    value = kind(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and name not in ("max_retries", "temperature")):
        raise ConfigError(f"{source}: {name} must be positive, not {value!r}")
    return value


def _prices(data: Mapping[str, Any], path: Path | None) -> Mapping[str, Price]:
    table = dict(DEFAULT_PRICES)
    for model, entry in data.get("prices", {}).items():
        try:
            price = Price(float(entry["input"]), float(entry["output"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: [prices.\"{model}\"] needs numeric input and output (USD per million tokens)") from None
        if price.input < 0 or price.output < 0:
            raise ConfigError(f"{path}: [prices.\"{model}\"] prices cannot be negative")
        table[model] = price
    return MappingProxyType(table)


def load_config(
    *,
    provider: str | None = None,
    base_url: str | None = None,
    model: str | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> LLMConfig:
    """Build the one configuration of a run. ``None`` arguments mean "not given"."""
    env = os.environ if env is None else env
    data, path = read_config_file(env)
    file_llm = data.get("llm", {})
    provider = provider or env.get("KERNFORGE_PROVIDER") or file_llm.get("provider")
    base_url = base_url or env.get("KERNFORGE_BASE_URL") or file_llm.get("base_url")
    preset, custom = _preset_for(provider, base_url)
    base_url = (base_url or preset.base_url).rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"base URL must start with http:// or https://, got {base_url!r}")
    model = model or env.get("KERNFORGE_MODEL") or file_llm.get("model") or preset.model

    settings: dict[str, Any] = {}
    for name in TUNABLES:
        if name in file_llm:
            settings[name] = _coerce(name, file_llm[name], f"{path} [llm]")
    for name, value in overrides.items():
        if name not in TUNABLES:
            raise ConfigError(f"unknown setting {name!r}; known: {', '.join(TUNABLES)}")
        if value is not None:
            settings[name] = _coerce(name, value, "option")
    if "temperature" not in settings and preset.temperature is not None:
        settings["temperature"] = preset.temperature

    key, source = _find_key(preset, custom, env, data, path)
    config = LLMConfig(
        provider=preset.name,
        base_url=base_url,
        model=model,
        api_key=key,
        key_source=source,
        max_tokens_param=preset.max_tokens_param,
        extra_body=preset.extra_body,
        prices=_prices(data, path),
        free=preset.free,
        config_path=str(path) if path else None,
    )
    return replace(config, **settings)


def needs_key(config: LLMConfig) -> bool:
    """Whether this endpoint cannot be used without a key (then the loop runs offline)."""
    if config.provider == "custom":
        return False
    return PRESETS[config.provider].needs_key


def api_key_source(provider: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """Which source holds a key for the configured provider (for ``kernforge doctor``); never the key."""
    env = os.environ if env is None else env
    data, path = read_config_file(env)
    provider = provider or env.get("KERNFORGE_PROVIDER") or data.get("llm", {}).get("provider")
    base_url = env.get("KERNFORGE_BASE_URL") or data.get("llm", {}).get("base_url")
    preset, custom = _preset_for(provider, base_url)
    return _find_key(preset, custom, env, data, path)[1]
