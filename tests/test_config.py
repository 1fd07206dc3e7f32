"""loop/config.py: presets, precedence, the config file, and a key that never shows."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re

import pytest

from kernforge.loop import config as cfg
from kernforge.loop.config import ConfigError, Price, Secret, api_key_source, load_config

KEY = "sk-test-4f9a1c7e2b"


@pytest.fixture
def env(tmp_path):
    """An environment with no keys whose default config file lives under tmp_path."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def write_config(tmp_path, text: str):
    path = tmp_path / "kernforge.toml"
    path.write_text(text)
    return path


def test_default_is_minimax_m3(env):
    c = load_config(env=env | {"MINIMAX_API_KEY": KEY})
    assert (c.provider, c.base_url, c.model) == ("minimax", "https://api.minimax.io/v1", "MiniMax-M3")
    assert c.key_source == "MINIMAX_API_KEY" and c.api_key.reveal() == KEY
    assert dict(c.extra_body) == {"reasoning_split": True}
    assert c.price() == Price(0.60, 2.40)


@pytest.mark.parametrize("provider, variable, base_url", [
    ("minimax", "MINIMAX_API_KEY", "https://api.minimax.io/v1"),
    ("minimax-cn", "MINIMAX_API_KEY", "https://api.minimaxi.com/v1"),
    ("together", "TOGETHER_API_KEY", "https://api.together.ai/v1"),
    ("openai", "OPENAI_API_KEY", "https://api.openai.com/v1"),
])
def test_presets_read_their_own_variable(env, provider, variable, base_url):
    c = load_config(provider=provider, env=env | {variable: KEY})
    assert c.base_url == base_url and c.key_source == variable and c.model
    other = "TOGETHER_API_KEY" if variable != "TOGETHER_API_KEY" else "OPENAI_API_KEY"
    assert load_config(provider=provider, env=env | {other: KEY}).api_key is None


def test_generic_key_wins_over_provider_key(env):
    c = load_config(env=env | {"MINIMAX_API_KEY": "other", "KERNFORGE_API_KEY": KEY})
    assert c.key_source == "KERNFORGE_API_KEY" and c.api_key.reveal() == KEY


def test_local_preset_needs_no_key_and_asks_the_server_for_its_model(env):
    c = load_config(provider="local", env=env)
    assert c.base_url == "http://localhost:8000/v1" and c.model == "" and c.api_key is None
    assert not cfg.needs_key(c) and c.price("anything") == Price(0.0, 0.0)


def test_custom_base_url_never_gets_a_providers_key(env):
    # A provider's key must not be sent to some other server just because it is in the environment.
    leaky = env | {"MINIMAX_API_KEY": KEY, "OPENAI_API_KEY": KEY}
    assert load_config(base_url="http://127.0.0.1:9/v1", env=leaky).api_key is None
    assert load_config(provider="minimax", base_url="http://127.0.0.1:9/v1", env=leaky).api_key is None
    c = load_config(base_url="http://127.0.0.1:9/v1", env=leaky | {"KERNFORGE_API_KEY": "generic"})
    assert c.provider == "custom" and c.api_key.reveal() == "generic"


def test_a_preset_url_selects_its_preset(env):
    c = load_config(base_url="https://api.together.ai/v1/", env=env | {"TOGETHER_API_KEY": KEY})
    assert c.provider == "together" and c.base_url == "https://api.together.ai/v1" and c.api_key is not None


def test_precedence_arguments_over_environment_over_file(tmp_path, env):
    path = write_config(tmp_path, '[llm]\nprovider = "openai"\nmodel = "from-file"\nconcurrency = 3\n')
    env = env | {"KERNFORGE_CONFIG": str(path)}
    assert load_config(env=env).model == "from-file"
    assert load_config(env=env).provider == "openai" and load_config(env=env).concurrency == 3
    assert load_config(env=env | {"KERNFORGE_MODEL": "from-env"}).model == "from-env"
    assert load_config(model="from-arg", env=env | {"KERNFORGE_MODEL": "from-env"}).model == "from-arg"
    assert load_config(concurrency=5, env=env).concurrency == 5
    assert load_config(concurrency=None, env=env).concurrency == 3  # None: option not given


def test_file_keys_prices_and_tunables(tmp_path, env):
    path = write_config(tmp_path, f"""
[llm]
provider = "together"
request_timeout_s = 120
max_retries = 0
temperature = 0.0

[keys]
together = "{KEY}"

[prices."MiniMaxAI/MiniMax-M3"]
input = 0.5
output = 2
""")
    c = load_config(env=env | {"KERNFORGE_CONFIG": str(path)})
    assert c.api_key.reveal() == KEY and c.key_source == f"{path} [keys] together"
    assert (c.request_timeout_s, c.max_retries, c.temperature) == (120.0, 0, 0.0)
    assert c.price() == Price(0.5, 2.0) and c.price().cost(1_000_000, 500_000) == pytest.approx(1.5)
    assert c.price("minimaxai/minimax-m3") == Price(0.5, 2.0)  # case-insensitive
    assert c.price("unknown-model") is None  # unknown: cost reported as None, never as 0
    assert c.config_path == str(path)


def test_default_file_location_follows_xdg(tmp_path):
    path = tmp_path / "xdg" / "kernforge" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(f'[llm]\napi_key = "{KEY}"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert cfg.config_path(env) == path
    assert api_key_source(env=env) == f"{path} [llm] api_key"


@pytest.mark.parametrize("text, message", [
    ("[llm\nprovider = 1", "not valid TOML"),
    ("[llm]\nmodle = 'x'", "unknown [llm] setting"),
    ("[lm]\nmodel = 'x'", "unknown table"),
    ("[llm]\nconcurrency = 'many'", "must be a number"),
    ("[llm]\nconcurrency = 0", "must be positive"),
    ("[llm]\nmax_retries = 1.5", "whole number"),
    ("[llm]\nprovider = 'nope'", "unknown provider"),
    ("[llm]\nbase_url = 'ftp://x'", "http:// or https://"),
    ("[prices.m]\ninput = 1", "needs numeric input and output"),
    ("[llm]\nmodel = 5", "[llm] model must be a string"),
    ("keys = 'abc'", "must be tables"),
])
def test_bad_config_files_are_clear_errors(tmp_path, env, text, message):
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(env=env | {"KERNFORGE_CONFIG": str(path)})


def test_missing_explicit_config_file_is_an_error(tmp_path, env):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(env=env | {"KERNFORGE_CONFIG": str(tmp_path / "absent.toml")})


def test_unknown_override_is_an_error(env):
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(env=env, concurency=2)


def test_the_key_never_shows(env):
    c = load_config(env=env | {"KERNFORGE_API_KEY": KEY})
    for text in (repr(c), str(c), f"{c}", repr(c.api_key), str(c.api_key), f"{c.api_key}", str(c.to_dict())):
        assert KEY not in text
    assert repr(c.api_key) == "***" and c.to_dict()["has_key"] is True and "api_key" not in c.to_dict()
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(c)
    assert copy.deepcopy(c).api_key.reveal() == KEY  # copies stay in-process and keep working
    with pytest.raises(AttributeError):
        c.api_key._value = "changed"


def test_config_is_frozen(env):
    c = load_config(env=env)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.model = "other"
    with pytest.raises(TypeError):
        c.prices["x"] = Price(1, 1)


def test_api_key_source_names_the_source_never_the_key(tmp_path, env):
    assert api_key_source(env=env) is None
    assert api_key_source(env=env | {"MINIMAX_API_KEY": KEY}) == "MINIMAX_API_KEY"
    assert api_key_source(env=env | {"KERNFORGE_PROVIDER": "openai", "MINIMAX_API_KEY": KEY}) is None
    assert api_key_source("openai", env=env | {"OPENAI_API_KEY": KEY}) == "OPENAI_API_KEY"
    path = write_config(tmp_path, f'[keys]\nminimax = "{KEY}"\n')
    source = api_key_source(env=env | {"KERNFORGE_CONFIG": str(path)})
    assert source == f"{path} [keys] minimax" and KEY not in source


def test_doctor_reports_the_source(monkeypatch, tmp_path):
    from kernforge.loop import doctor

    for name in cfg.KEY_ENV_VARS + ("KERNFORGE_PROVIDER", "KERNFORGE_BASE_URL", "KERNFORGE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert doctor._api_key().ok is False
    monkeypatch.setenv("MINIMAX_API_KEY", KEY)
    check = doctor._api_key()
    assert check.ok and "MINIMAX_API_KEY" in check.detail and KEY not in check.detail


def test_key_env_vars_cover_every_preset():
    assert set(cfg.KEY_ENV_VARS) == {"KERNFORGE_API_KEY", "MINIMAX_API_KEY", "TOGETHER_API_KEY", "OPENAI_API_KEY"}


def test_secret_survives_only_in_process():
    s = Secret(KEY)
    assert s.reveal() == KEY and copy.copy(s) is s
    with pytest.raises(TypeError):
        pickle.dumps({"nested": [s]})
