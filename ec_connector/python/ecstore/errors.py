"""ecstore errors as Python exceptions.

Every C code of ``include/ecstore/error.h`` maps to one exception class;
all derive from :class:`EcstoreError`, which carries

- ``code``: the negative ``ECS_E*`` value (e.g. -5),
- ``name``: its name without the prefix (e.g. ``"ENOTFOUND"``),
- ``strerror``: the C library's text for the code (``ecs_strerror``),
- ``detail``: the handle's detail of the failure (``ecs_client_errmsg`` or
  the ``errbuf`` of a connect), "" when the C side gave none,
- ``statuses``: for a batch call that failed as a whole, the per-item
  statuses it still produced (items on other servers may have succeeded),
  else None.

The message is ``"<strerror> (<NAME>): <detail>"``.  Classes also derive from
the closest built-in exception where one fits (``KeyError`` for a missing
key, ``TimeoutError``, ``ConnectionError``, ``ValueError`` for bad input),
so generic handlers keep working.
"""

from . import _lib


class EcstoreError(Exception):
    """Base of every ecstore error; see the module doc for the attributes."""

    def __init__(self, code, detail="", statuses=None):
        code = int(code)
        text = strerror(code)
        msg = "%s (%s)" % (text, err_name(code))
        if detail:
            msg += ": " + detail
        # Attributes after the base __init__: OSError's would reset strerror.
        super().__init__(msg)
        self.code = code
        self.name = err_name(code)
        self.strerror = text
        self.detail = detail or ""
        self.statuses = statuses

    def __str__(self):
        return self.args[0]


class InvalidArgumentError(EcstoreError, ValueError):
    """EINVAL, EKEY, EDTYPE, EOVERFLOW: the call's input is wrong."""


class NoMemoryError(EcstoreError, MemoryError):
    """ENOMEM: out of host memory."""


class NoSpaceError(EcstoreError):
    """ENOSPC, ETOOBIG: the pool has (or can ever have) no room; EQUOTA: the
    token's quota is spent; EPINQUOTA: hard pins would pass their quota."""


class NotFoundError(EcstoreError, KeyError):
    """ENOTFOUND: no object under the key (absent, evicted or stale)."""

    def __str__(self):  # KeyError would repr() the message
        return self.args[0]


class ConflictError(EcstoreError):
    """ECONFLICT: the key holds different content."""


class DeadlineExceededError(EcstoreError, TimeoutError):
    """ETIMEDOUT: the call's deadline passed."""


class ConnectionFailedError(EcstoreError, ConnectionError):
    """ECONN, ENOTCONN: a server or Redis could not be reached or hung up."""


class ProtocolError(EcstoreError):
    """EPROTO: a peer sent something the protocol does not allow."""


class ChecksumError(EcstoreError):
    """ECHECKSUM: received bytes do not match the object's checksum."""


class BufferTooSmallError(EcstoreError, ValueError):
    """EBUFSMALL: the destination is smaller than the object."""


class RedisError(EcstoreError):
    """EREDIS: Redis answered with an error or is unusable."""


class AuthError(EcstoreError, PermissionError):
    """EAUTH: the server refused the namespace or token; EPERM: the token
    lacks the right for the request (the server's --acl-file)."""


class BusyError(EcstoreError):
    """EBUSY: no room right now (e.g. the connector's staging pool)."""


class StaleError(EcstoreError):
    """ESTALE: a record of a node that restarted."""


class NotSupportedError(EcstoreError, NotImplementedError):
    """ENOTSUP, ENODEV: this build, server or machine cannot do it."""


class CanceledError(EcstoreError):
    """ECANCELED: the operation was canceled (e.g. a released load)."""


class EcstoreIOError(EcstoreError, OSError):
    """EIO: an input/output error (also: saves that failed, see wait_for_save)."""


class CodecError(EcstoreError):
    """ECODEC: compression or decompression failed."""


_BY_NAME = {
    "EINVAL": InvalidArgumentError,
    "EKEY": InvalidArgumentError,
    "EDTYPE": InvalidArgumentError,
    "EOVERFLOW": InvalidArgumentError,
    "ENOMEM": NoMemoryError,
    "ENOSPC": NoSpaceError,
    "ETOOBIG": NoSpaceError,
    "EQUOTA": NoSpaceError,
    "EPINQUOTA": NoSpaceError,
    "ENOTFOUND": NotFoundError,
    "ECONFLICT": ConflictError,
    "ETIMEDOUT": DeadlineExceededError,
    "ECONN": ConnectionFailedError,
    "ENOTCONN": ConnectionFailedError,
    "EPROTO": ProtocolError,
    "ECHECKSUM": ChecksumError,
    "EBUFSMALL": BufferTooSmallError,
    "EREDIS": RedisError,
    "EAUTH": AuthError,
    "EPERM": AuthError,
    "EBUSY": BusyError,
    "ESTALE": StaleError,
    "ENOTSUP": NotSupportedError,
    "ENODEV": NotSupportedError,
    "ECANCELED": CanceledError,
    "EIO": EcstoreIOError,
    "ECODEC": CodecError,
}


def strerror(code):
    """ecs_strerror(code) as str."""
    return _lib.lib().ecs_strerror(int(code)).decode()


def err_name(code):
    """ecs_err_name(code) as str, e.g. "ENOTFOUND" (or "UNKNOWN")."""
    return _lib.lib().ecs_err_name(int(code)).decode()


def error_class(code):
    """The exception class for an ECS_E* code (EcstoreError if unmapped)."""
    return _BY_NAME.get(err_name(code), EcstoreError)


def make_error(code, detail="", statuses=None):
    """An exception instance for code (not raised)."""
    return error_class(code)(code, detail, statuses)


def check(code, detail="", statuses=None):
    """Raises the exception for code when it is not 0 (ECS_OK)."""
    if code != 0:
        raise make_error(code, detail, statuses)
