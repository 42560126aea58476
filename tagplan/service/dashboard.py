"""The dashboard: a web page the service serves itself at ``/ui/`` (docs/dashboard.md).

Plain HTML, CSS and JavaScript files of this package, no build step and no library from
elsewhere, so it works on an air-gapped cluster; every chart is drawn by the page from
the same API the schedulers and dashboards use. The page asks for an API key and keeps it
in the browser tab's session storage, sending it as a header: never in a URL. Its
Content-Security-Policy lets it load only its own files and talk only to this service.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

__all__ = ["UI_DIR", "mount_dashboard"]

UI_DIR = Path(__file__).resolve().parent / "ui"
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


class _DashboardFiles(StaticFiles):
    """The page's files with the security headers of a page that handles keys."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"cache-control", b"no-cache"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await super().__call__(scope, receive, with_headers)


def mount_dashboard(app: FastAPI) -> None:
    """Serve the page at ``/ui/``; ``/`` leads there."""
    app.mount("/ui", _DashboardFiles(directory=UI_DIR, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/")
