"""Whether the Prefect API this process is configured for takes its credentials. A server
started with an auth string (PREFECT_SERVER_API_AUTH_STRING; infra/README.md, Security) answers
every request but its health check with 401 unless the client sends the same string
(PREFECT_API_AUTH_STRING); Prefect's client then fails with a traceback from deep inside it, so
the commands that need the API ask once, first, and say it in one line."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_API_AUTH_STRING

UNAUTHORIZED = 401


def refusal(url: str) -> str | None:
    """None when the API at ``url`` (this process's PREFECT_API_URL) takes this process's
    credentials; otherwise the one line that says why it does not and what to do."""
    try:
        # Entering the client asks the server's version, which needs the credentials too.
        with get_client(sync_client=True) as client:
            client.hello()
    except PrefectHTTPStatusError as exc:
        if exc.response.status_code != UNAUTHORIZED:
            raise
        sent = "a PREFECT_API_AUTH_STRING it does not accept" if PREFECT_API_AUTH_STRING.value() \
            else "no PREFECT_API_AUTH_STRING"
        return (f"the Prefect server at {url} requires its API auth string and this process sent {sent}: "
                "set PREFECT_API_AUTH_STRING to the server's (set -a && . infra/.env && set +a; "
                "infra/README.md, Security)")
    return None
