"""``ecstore.mooncake.store``: the names of ``mooncake.store``, so that
``from mooncake.store import ...`` becomes ``from ecstore.mooncake.store
import ...`` (the same objects as ``ecstore.mooncake``'s)."""

from . import *  # noqa: F401,F403 - re-exports the store class, ReplicateConfig and the codes
from . import MooncakeDistributedStore, ReplicateConfig, SoftPinAction, ObjectDataType  # noqa: F401
