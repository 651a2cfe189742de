"""Settings: embedded defaults, OMNIJOBS_ environment, production refuses placeholders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import DEFAULT_ALIASES, PLACEHOLDER_SECRETS, Settings

_MISSING = object()  # leave the field out (its default applies)
GOOD_SECRET = "a-real-signing-secret-0123456789"
PRODUCTION = dict(
    mode="production",
    database_url="postgresql://omnijobs@db.internal:5432/omnijobs",
    broker_url="redis://redis.internal:6379/0",
    signing_secret=GOOD_SECRET,
    object_store="s3",
    s3_endpoint_url="http://s3.internal:8333",
    s3_access_key_id="omnijobs",
    s3_secret_access_key="a-real-s3-secret-access-key",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No OMNIJOBS_ variable from the outside, and a scratch working directory."""
    for name in list(os.environ):
        if name.startswith("OMNIJOBS_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def production(**overrides) -> Settings:
    values = dict(PRODUCTION)
    values.update(overrides)
    for key in [k for k, v in values.items() if v is _MISSING]:
        del values[key]
    return Settings(**values)


def test_defaults_are_the_embedded_mode(clean_env: Path) -> None:
    s = Settings()
    assert s.mode == "embedded"
    assert s.database_url is None and s.broker_url is None
    home = (clean_env / ".omnijobs").resolve()
    assert s.db_url == f"sqlite:///{home / 'omnijobs.db'}"
    assert s.broker == "filesystem://"
    assert s.broker_folder == home / "broker"
    assert s.object_store == "local"
    assert s.objects_dir == home / "objects"
    assert s.model_aliases == DEFAULT_ALIASES


def test_embedded_mode_accepts_placeholder_secrets() -> None:
    s = Settings(signing_secret="change-me", object_store="s3", s3_secret_access_key=None)
    assert s.signing_secret == "change-me"


def test_home_moves_the_embedded_paths(tmp_path: Path) -> None:
    s = Settings(home=tmp_path / "elsewhere")
    home = (tmp_path / "elsewhere").resolve()
    assert s.db_url == f"sqlite:///{home / 'omnijobs.db'}"
    assert s.objects_dir == home / "objects"
    assert s.broker_folder == home / "broker"


def test_explicit_urls_win_over_embedded_defaults() -> None:
    s = Settings(database_url="postgresql://x@h/db", broker_url="redis://h:6379/3")
    assert s.db_url == "postgresql://x@h/db"
    assert s.broker == "redis://h:6379/3"


def test_environment_prefix_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OMNIJOBS_HOME", str(tmp_path / "envhome"))
    monkeypatch.setenv("OMNIJOBS_BROKER_URL", "redis://127.0.0.1:6379/9")
    monkeypatch.setenv("OMNIJOBS_OBJECT_STORE", "s3")
    monkeypatch.setenv("OMNIJOBS_S3_BUCKET", "from-env")
    monkeypatch.setenv("OMNIJOBS_LEASE_S", "7.5")
    monkeypatch.setenv("OMNIJOBS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("OMNIJOBS_S3_CREATE_BUCKET", "false")
    monkeypatch.setenv("OMNIJOBS_PIPELINES", '["piper-joe", "test-silent"]')
    monkeypatch.setenv("OMNIJOBS_MODEL_ALIASES", '{"tts-1": "test-silent"}')
    s = Settings()
    assert s.home == tmp_path / "envhome"
    assert s.db_url == f"sqlite:///{(tmp_path / 'envhome' / 'omnijobs.db').resolve()}"
    assert s.broker == "redis://127.0.0.1:6379/9"
    assert s.object_store == "s3"
    assert s.s3_bucket == "from-env"
    assert s.lease_s == 7.5
    assert s.max_attempts == 5
    assert s.s3_create_bucket is False
    assert s.pipelines == ["piper-joe", "test-silent"]
    assert s.model_aliases == {**DEFAULT_ALIASES, "tts-1": "test-silent"}


def test_unprefixed_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://wrong@h/db")
    monkeypatch.setenv("MODE", "production")
    s = Settings()
    assert s.database_url is None
    assert s.mode == "embedded"


def test_invalid_environment_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIJOBS_OBJECT_STORE", "ftp")
    with pytest.raises(ValidationError):
        Settings()
    monkeypatch.setenv("OMNIJOBS_OBJECT_STORE", "local")
    monkeypatch.setenv("OMNIJOBS_LEASE_S", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_production_from_environment_refuses_default_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIJOBS_MODE", "production")
    monkeypatch.setenv("OMNIJOBS_DATABASE_URL", PRODUCTION["database_url"])
    monkeypatch.setenv("OMNIJOBS_BROKER_URL", PRODUCTION["broker_url"])
    monkeypatch.setenv("OMNIJOBS_OBJECT_STORE", "local")
    with pytest.raises(ValidationError, match="SIGNING_SECRET"):
        Settings()
    monkeypatch.setenv("OMNIJOBS_SIGNING_SECRET", GOOD_SECRET)
    assert Settings().mode == "production"


@pytest.mark.parametrize("secret", sorted(PLACEHOLDER_SECRETS | {"dev-insecure-signing-secret",
                                                                 "short-secret"}))
def test_production_refuses_placeholder_signing_secret(secret: str) -> None:
    with pytest.raises(ValidationError, match="SIGNING_SECRET"):
        production(signing_secret=secret)


def test_production_refuses_default_signing_secret() -> None:
    with pytest.raises(ValidationError, match="SIGNING_SECRET"):
        production(signing_secret=_MISSING)


@pytest.mark.parametrize("secret", [_MISSING, None, "", "minioadmin", "change-me", "secret"])
def test_production_s3_refuses_missing_or_placeholder_secret(secret) -> None:
    with pytest.raises(ValidationError, match="S3_SECRET_ACCESS_KEY"):
        production(s3_secret_access_key=secret)


def test_production_local_store_needs_no_s3_secret() -> None:
    s = production(object_store="local",
                   **{k: _MISSING for k in PRODUCTION if k.startswith("s3_")})
    assert s.object_store == "local" and s.s3_secret_access_key is None


@pytest.mark.parametrize("missing", ["database_url", "broker_url"])
def test_production_refuses_missing_urls(missing: str) -> None:
    with pytest.raises(ValidationError, match="DATABASE_URL and OMNIJOBS_BROKER_URL"):
        production(**{missing: _MISSING})


def test_production_refuses_a_local_store_it_was_not_asked_for() -> None:
    """Every S3 variable set but OMNIJOBS_OBJECT_STORE: once served from the local disk
    without a word."""
    with pytest.raises(ValidationError) as refused:
        production(object_store=_MISSING)
    message = str(refused.value)
    assert "OMNIJOBS_OBJECT_STORE is unset: production needs `s3`" in message
    assert "OMNIJOBS_S3_ENDPOINT_URL, OMNIJOBS_S3_ACCESS_KEY_ID, " \
           "OMNIJOBS_S3_SECRET_ACCESS_KEY set: did you mean `s3`?" in message
    bare = {k: _MISSING for k in PRODUCTION if k.startswith("s3_")}
    with pytest.raises(ValidationError, match="OMNIJOBS_OBJECT_STORE is unset") as refused:
        production(object_store=_MISSING, **bare)
    assert "did you mean" not in str(refused.value)


@pytest.mark.parametrize("variable", ["s3_endpoint_url", "s3_bucket", "s3_create_bucket",
                                      "s3_public_endpoint_url"])
def test_production_refuses_s3_variables_a_local_store_would_ignore(variable) -> None:
    bare = {k: _MISSING for k in PRODUCTION if k.startswith("s3_")}
    value = False if variable == "s3_create_bucket" else "http://s3.internal:8333"
    with pytest.raises(ValidationError) as refused:
        production(object_store="local", **{**bare, variable: value})
    assert (f"OMNIJOBS_OBJECT_STORE is `local`, so OMNIJOBS_{variable.upper()} would be "
            "ignored") in str(refused.value)


def test_production_refusals_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PRODUCTION.items():
        monkeypatch.setenv(f"OMNIJOBS_{name.upper()}", value)
    monkeypatch.delenv("OMNIJOBS_OBJECT_STORE")
    with pytest.raises(ValidationError, match="OMNIJOBS_OBJECT_STORE is unset"):
        Settings()
    monkeypatch.setenv("OMNIJOBS_OBJECT_STORE", "local")
    with pytest.raises(ValidationError, match="would be ignored"):
        Settings()
    for name in PRODUCTION:
        if name.startswith("s3_"):
            monkeypatch.delenv(f"OMNIJOBS_{name.upper()}")
    assert Settings().object_store == "local"  # asked for, nothing ignored


def test_production_accepts_a_complete_config() -> None:
    s = production()
    assert s.mode == "production"
    assert s.db_url == PRODUCTION["database_url"]
    assert s.broker == PRODUCTION["broker_url"]
    assert s.object_store == "s3"
    assert s.signing_secret == GOOD_SECRET
    assert s.s3_secret_access_key == PRODUCTION["s3_secret_access_key"]
