"""Failure kinds of the errors table, and how exceptions map onto them."""

from __future__ import annotations

import errno
import re
import socket
import ssl
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pipeline.progress import log


class ErrorKind(StrEnum):
    TRANSIENT = "transient"  # retried with backoff, and again on the next run
    PERMANENT = "permanent"  # the item is gone for good (private, removed, 404)
    BAD_INPUT = "bad_input"  # the item exists but is unusable (corrupt media, broken subtitles)
    # The site refused the session, not the item (bot check, HTTP 429s, "try again later"):
    # never final, so the next run tries the item again.
    BLOCKED = "blocked"
    # Our own code failed on the item (a bug in vlcorpus, not a verdict on it): never final, so
    # the next run tries the item again; the traceback is in the log.
    INTERNAL = "internal"


class StageError(Exception):
    """An item failed in a way the stage understood; ``kind`` says what to do about it."""

    kind: ErrorKind = ErrorKind.PERMANENT


class TransientError(StageError):
    kind = ErrorKind.TRANSIENT


class PermanentError(StageError):
    kind = ErrorKind.PERMANENT


class BadInputError(StageError):
    kind = ErrorKind.BAD_INPUT


class NetworkError(TransientError):
    """The network failed on the way to the site (see NETWORK_FAILURE): downloads tell a
    network that is down from one video's failure with pipeline/download/outage.py."""


class BlockedError(StageError):
    kind = ErrorKind.BLOCKED


class InternalError(StageError):
    kind = ErrorKind.INTERNAL


_BY_KIND: dict[ErrorKind, type[StageError]] = {
    ErrorKind.TRANSIENT: TransientError,
    ErrorKind.PERMANENT: PermanentError,
    ErrorKind.BAD_INPUT: BadInputError,
    ErrorKind.BLOCKED: BlockedError,
    ErrorKind.INTERNAL: InternalError,
}


def error(kind: ErrorKind, message: str) -> StageError:
    """A StageError of ``kind`` saying ``message``."""
    return _BY_KIND[kind](message)


class SetupError(Exception):
    """The stage cannot run at all (a missing model, package or credentials). Not an item's
    fault: it stops the run instead of failing every item."""


class StageStopped(Exception):
    """The stage cannot go on for now (e.g. the site has refused every download for too long).
    Not the items' fault: the batch commits the outcomes in ``finished`` and the items without
    one stay to do, with no errors row; the stage ends with this message."""

    def __init__(self, message: str, finished: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.finished = list(finished)


# Errors of the machine rather than of the item: retrying later may succeed.
_TRANSIENT_ERRNOS = {errno.ENOSPC, errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET}

# A failure of the network or of the machine's way to it, as yt-dlp, urllib3 and the OS word it:
# name resolution, connections refused, reset or unreachable, TLS handshakes, proxies and
# time-outs. Never a verdict on the item. Earlier versions judged name-resolution failures
# permanent; planning reads such rows as transient (pipeline/runner/plan.py). One pattern for
# Python's re and Arrow's RE2, matched ignoring case.
NETWORK_FAILURE = (
    r"timed? ?out|Connection (reset|refused|aborted)|Remote end closed|IncompleteRead"
    r"|RemoteDisconnected|Temporary failure|EOF occurred|Broken pipe|BadStatusLine"
    r"|Errno (10[1345]|11[013]|32|-[235])\b|Failed to resolve|Name or service not known"
    r"|nodename nor servname|getaddrinfo failed|No address associated with hostname"
    r"|Network is unreachable|No route to host|Failed to establish a new connection"
    r"|SSL(Error|:)|\bTLS\b|handshake|ProxyError|Unable to connect to proxy|Tunnel connection failed"
)
_NETWORK = re.compile(NETWORK_FAILURE, re.I)
# Of those, the resolver's answer that the name does not exist (EAI_NONAME, EAI_NODATA), as
# opposed to its "try again" (EAI_AGAIN) when it cannot reach a name server. Still transient on
# its own: only the same host failing so on several days while others resolve makes it final
# (pipeline/download/gone_hosts.py).
_NAME_NOT_FOUND = re.compile(r"Name or service not known|nodename nor servname|getaddrinfo failed"
                             r"|No address associated with hostname|Errno -[25]\b", re.I)


def network_failure(message: str) -> bool:
    """Whether ``message`` says the network failed (see NETWORK_FAILURE)."""
    return _NETWORK.search(message) is not None


def name_not_found(message: str) -> bool:
    """Whether ``message`` says a host name does not exist."""
    return _NAME_NOT_FOUND.search(message) is not None


# A host judged gone from evidence across runs (pipeline/download/gone_hosts.py): the one permanent
# verdict whose message names a network failure (the resolver's last answer), so planning must
# not read it as a legacy network row.
GONE_HOST_PREFIX = "host gone: "

INTERNAL_PREFIX = "internal error"
# What earlier versions wrote for the same failures, with the kind permanent: planning retries
# those rows as internal ones (pipeline/runner/plan.py), so no video stays lost to them.
LEGACY_INTERNAL_PREFIX = "unexpected "


def classify(exc: BaseException) -> tuple[ErrorKind, str]:
    """Kind and a one-line message for an exception raised while processing an item. A verdict
    on the item comes only from a StageError (raised where yt-dlp, ffmpeg or the item's data
    said what is wrong) or a failure of the machine (transient); any other exception is our
    own code failing: internal, logged here with its traceback, and tried again next run."""
    if isinstance(exc, StageError):
        return exc.kind, str(exc) or type(exc).__name__
    message = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if isinstance(exc, (TimeoutError, ConnectionError, socket.timeout, socket.gaierror, ssl.SSLError)):
        return ErrorKind.TRANSIENT, message
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return ErrorKind.TRANSIENT, message
    log.error("%s (a bug in vlcorpus, not the item's fault): %s", INTERNAL_PREFIX, message, exc_info=exc)
    return ErrorKind.INTERNAL, (f"{INTERNAL_PREFIX} (a bug in vlcorpus, not a verdict on this item; "
                                f"the next run tries it again): {message}")
