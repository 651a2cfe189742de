"""``omnijobs migrate`` takes any database URL, a password with '%' included."""

from __future__ import annotations

from storage.migrate import alembic_config, upgrade

from ..services import create_database, drop_database


def test_percent_in_the_url_survives_the_alembic_config():
    url = "postgresql://omnijobs:p%25ss%word@db:5432/omnijobs"
    assert alembic_config(url).get_main_option("sqlalchemy.url") == url


def test_migrate_with_a_percent_in_the_password():
    url = create_database()
    try:
        # Trust authentication ignores the password; Alembic's config parser does not.
        user, rest = url.split("://", 1)[1].split("@", 1)
        upgrade(f"postgresql://{user}:50%25off%@{rest}")
    finally:
        drop_database(url)
