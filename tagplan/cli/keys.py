"""``tagplan keys``: create, list and revoke API keys in the service's database."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy import select

from tagplan.cli.common import EXIT_BAD_INPUT, console, error_console, print_json
from tagplan.db.keys import SCOPES, create_key
from tagplan.db.migrate import upgrade
from tagplan.db.models import ApiKey, utcnow
from tagplan.db.session import session_scope
from tagplan.service.schemas import INT32_MAX
from tagplan.settings import get_settings

app = typer.Typer(help="API keys (stored hashed; the token is shown once).", no_args_is_help=True)


def _url() -> str:
    settings = get_settings()
    if settings.embedded:
        upgrade(settings.sqlalchemy_url)  # a fresh embedded data directory has no tables yet
    return settings.sqlalchemy_url


@app.command("create")
def create_command(
    scope: Annotated[
        list[str], typer.Option("--scope", "-s", help=f"Repeatable: {', '.join(SCOPES)}.")
    ],
    name: Annotated[str, typer.Option(help="What the key is for.")] = "",
    rate_limit: Annotated[
        int | None,
        typer.Option(min=1, max=INT32_MAX, help="Requests per minute (default: the service's)."),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            help="The tenant (team, project) whose jobs and uploads the key shares; "
            "default: a tenant of its own."
        ),
    ] = None,
) -> None:
    """Create a key and print its token (keep it: only its hash is stored)."""
    try:
        with session_scope(_url()) as session:
            row, token = create_key(
                session, scopes=scope, name=name, rate_limit=rate_limit, tenant=tenant
            )
            scopes, owner = row.scopes, row.tenant
    except ValueError as exc:
        error_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    error_console.print(
        f"created key {row.id} of tenant {owner} with scopes: {scopes}", highlight=False
    )
    console.print(token, highlight=False, soft_wrap=True)


@app.command("list")
def list_command() -> None:
    """Keys with their scopes (never the tokens)."""
    with session_scope(_url()) as session:
        rows = session.scalars(select(ApiKey).order_by(ApiKey.created_at)).all()
        print_json(
            [
                {
                    "id": r.id,
                    "name": r.name,
                    "tenant": r.tenant,
                    "scopes": r.scopes.split(),
                    "rate_limit_per_minute": r.rate_limit_per_minute,
                    "revoked": r.revoked_at is not None,
                }
                for r in rows
            ]
        )


@app.command("revoke")
def revoke_command(key_id: Annotated[str, typer.Argument(help="Key id (tpk_<id>_...).")]) -> None:
    """Revoke a key (services stop accepting it within seconds)."""
    with session_scope(_url()) as session:
        row = session.get(ApiKey, key_id)
        if row is None:
            error_console.print(f"[bold red]error:[/] no key {key_id}", highlight=False)
            raise typer.Exit(EXIT_BAD_INPUT)
        row.revoked_at = row.revoked_at or utcnow()
    console.print(f"revoked {key_id}")
