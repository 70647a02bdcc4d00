"""ecstore: the encoder-cache tensor store, from Python.

A thin ctypes binding over libecstore (nothing is compiled at install):

- :class:`Store` / :func:`connect`: the store client, with the Mooncake
  Store method names (``batch_put_from``, ``batch_get_into``,
  ``batch_is_exist``, ``register_buffer``, ``remove``, ``close``) and tensor
  helpers for numpy arrays and torch CPU tensors (``put_tensor``,
  ``get_tensor``, ``batch_put_tensors``, ``batch_get_tensors``);
- :class:`ECConnector`: vLLM's EC connector roles over the C ec_connector
  (producer, scheduler, consumer);
- :class:`EcstoreError` and its subclasses: every C error code, with the C
  library's text.

See docs/python.md.  The library is found through ``ECSTORE_LIB``, then the
source tree's ``build/lib``, then the system loader (see ``_lib``).
"""

from . import codes
from .codes import *  # noqa: F401,F403 - OK, ENOTFOUND, ... as ecstore.ENOTFOUND
from .errors import (
    AuthError,
    BufferTooSmallError,
    BusyError,
    CanceledError,
    ChecksumError,
    CodecError,
    ConflictError,
    ConnectionFailedError,
    DeadlineExceededError,
    EcstoreError,
    EcstoreIOError,
    InvalidArgumentError,
    NoMemoryError,
    NoSpaceError,
    NotFoundError,
    NotSupportedError,
    ProtocolError,
    RedisError,
    StaleError,
    check,
    err_name,
    error_class,
    strerror,
)
from .store import Store, connect
from .connector import ECConnector, LoadHandle
from ._lib import lib_path, has_connector

__version__ = "0.1.0"
