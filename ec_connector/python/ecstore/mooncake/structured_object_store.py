"""Codec inference of Mooncake's ``mooncake.structured_object_store``, for
code that imports it: ``infer_structure`` walks a column of Python values
(one per row) into interior nodes (dicts, short lists of containers) and
leaf columns, and ``_choose_leaf_codec`` names the codec a leaf column
would be stored with.  Written for ecstore from the behaviour of
mooncake-transfer-engine 0.3.13.post1 (tests/python/test_mooncake_codec.py
compares every decision with that release's, input by input).

Not provided: the bundle transfer machinery of that module
(``MooncakeBundleTransfer``, ``StructuredObjectPayload``, the DataProto
references): docs/mooncake.md says why.

Decisions.  A column's *present* values are those that are neither None nor
``MISSING``.  With none present, nothing is accepted.  Otherwise, in this
order, the first rule that every present value meets decides:

==========================================  ===================  =========
present values                              codec                accepted
==========================================  ===================  =========
torch tensors, one dtype                    ``ragged_tensor``    yes
torch tensors, several dtypes               ``ragged_tensor``    no
lists/tuples of images or bytes-likes       ``media_list_ragged`` yes
numeric numpy arrays                        ``typed_ragged``     yes
numpy arrays, any not numeric               ``msgpack_ragged``   no
lists/tuples converting to one numeric      ``typed_ragged``     yes
dtype (numpy promotion)
bool/int/float/numpy scalars                ``ndarray``          yes
bytes, bytearray, memoryview                ``bytes_ragged``     yes
PIL images                                  ``media_bytes``      yes
str                                         ``utf8_ragged``      yes
dicts, lists, tuples                        ``msgpack_ragged``   yes
anything else                               ``msgpack_ragged``   no
==========================================  ===================  =========

Structure.  A column whose present values are all dicts with str keys (at
most 64 distinct) becomes a "dict" node whose children are the sorted keys;
each child column holds the row's value, ``MISSING`` where the row's dict
lacks the key, None where the row had no dict.  A column whose present
values are all lists/tuples of at most 8 items, each item None or a
container, becomes a "list" node of children 0..longest-1 with each row's
length (0 for a row without a list); short rows give ``MISSING``.  A node's
``row_mask`` marks the rows that had the container.  Child paths are
``parent.key`` (key escaped: ``\\``, ``.`` and ``[`` get a backslash) and
``parent[i]``.  Deeper than 32 levels raises ValueError.
"""

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

try:
    import torch as _torch
except ImportError:  # torch is optional: tensor columns then never match
    _torch = None

__all__ = ["MISSING", "infer_structure"]

_MAX_KEYS = 64  # distinct dict keys a column may expand to
_MAX_LIST = 8  # items a list column may expand to
_MAX_DEPTH = 32  # nesting levels before infer_structure gives up


@dataclass
class _CodecDecision:
    """What _choose_leaf_codec decided for a column."""

    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict = field(default_factory=dict)


@dataclass
class _InferredLeaf:
    path: str
    values: list
    decision: _CodecDecision


@dataclass
class _InferredNode:
    path: str
    node_type: str  # "dict" or "list"
    children: list
    lengths: Optional[list] = None  # list nodes: each row's length
    row_mask: Optional[list] = None  # the rows that had the container


class _Missing:
    """The value of a dict key a row lacks (not the same as a None value)."""

    __slots__ = ()

    def __repr__(self):
        return "<MISSING>"

    def __reduce__(self):
        return "MISSING"  # pickles as the one instance


MISSING = _Missing()


def _present(values):
    return [v for v in values if v is not None and v is not MISSING and not isinstance(v, _Missing)]


def _bytes_like(v):
    return isinstance(v, (bytes, bytearray, memoryview))


def _image(v):
    cls = type(v)
    return (getattr(cls, "__module__", "") or "").startswith("PIL.") and hasattr(v, "save")


def _media_list(v):
    return isinstance(v, (list, tuple)) and all(_image(x) or _bytes_like(x) for x in v)


def _scalar(v):
    return isinstance(v, (bool, int, float, np.number))


def _numeric(dt):
    return np.issubdtype(dt, np.number)


def _common_dtype(arrays_or_scalars):
    """numpy's promotion of the values' dtypes, or None when there is none."""
    try:
        return np.result_type(*arrays_or_scalars)
    except (TypeError, ValueError, OverflowError):
        return None


def _tensor_rule(vals):
    if _torch is None or not all(isinstance(v, _torch.Tensor) for v in vals):
        return None
    kinds = sorted({str(v.dtype) for v in vals})
    if len(kinds) > 1:
        return _CodecDecision(False, "ragged_tensor", "tensors of several dtypes %s" % kinds, "torch.Tensor")
    return _CodecDecision(True, "ragged_tensor", "every value a tensor of one dtype", "torch.Tensor",
                          {"dtype": kinds[0]})


def _media_list_rule(vals):
    if all(_media_list(v) for v in vals):
        return _CodecDecision(True, "media_list_ragged", "every value a list of images or bytes", "media list")
    return None


def _ndarray_rule(vals):
    if not all(isinstance(v, np.ndarray) for v in vals):
        return None
    if all(_numeric(v.dtype) for v in vals):
        return _CodecDecision(True, "typed_ragged", "every value a numeric array", "numeric sequence",
                              {"recursive_source": "ndarray"})
    return _CodecDecision(False, "msgpack_ragged", "arrays that are not all numeric", "python object")


def _sequence_rule(vals):
    if not all(isinstance(v, (list, tuple)) for v in vals):
        return None
    try:
        dt = _common_dtype([np.asarray(v).dtype for v in vals])
    except (TypeError, ValueError, OverflowError):
        dt = None
    if dt is not None and _numeric(dt):
        return _CodecDecision(True, "typed_ragged", "every value a numeric sequence", "numeric sequence",
                              {"dtype": str(dt)})
    return None  # later rules decide (msgpack for containers)


def _scalar_rule(vals):
    if all(_scalar(v) for v in vals):
        return _CodecDecision(True, "ndarray", "every value a number", "numeric scalar",
                              {"dtype": str(np.result_type(*vals))})
    return None


def _simple_rule(pred, codec, why, kind):
    def rule(vals):
        return _CodecDecision(True, codec, why, kind) if all(pred(v) for v in vals) else None

    return rule


_RULES = (
    _tensor_rule,
    _media_list_rule,
    _ndarray_rule,
    _sequence_rule,
    _scalar_rule,
    _simple_rule(_bytes_like, "bytes_ragged", "every value bytes-like", "bytes-like"),
    _simple_rule(_image, "media_bytes", "every value an image", "media"),
    _simple_rule(lambda v: isinstance(v, str), "utf8_ragged", "every value a str", "str"),
    _simple_rule(lambda v: isinstance(v, (dict, list, tuple)), "msgpack_ragged", "every value a container",
                 "msgpack"),
)


def _choose_leaf_codec(values):
    """The codec of a leaf column (the table in the module doc)."""
    vals = _present(values)
    if not vals:
        return _CodecDecision(False, "msgpack_ragged", "no value present (all None)", "msgpack")
    for rule in _RULES:
        d = rule(vals)
        if d is not None:
            return d
    return _CodecDecision(False, "msgpack_ragged", "no codec takes these values", "python object")


def _escape_key(key):
    """A dict key as a path component: backslash, '.' and '[' escaped."""
    out = []
    for ch in key:
        out.append("\\" + ch if ch in "\\.[" else ch)
    return "".join(out)


def _dict_children(vals):
    if not vals or not all(isinstance(v, dict) for v in vals):
        return None
    keys = set()
    for v in vals:
        keys.update(v)
    if len(keys) > _MAX_KEYS or not all(isinstance(k, str) for k in keys):
        return None
    return sorted(keys)


def _list_width(vals):
    if not vals or not all(isinstance(v, (list, tuple)) for v in vals):
        return None
    width = max(len(v) for v in vals)
    if width > _MAX_LIST:
        return None
    for v in vals:
        for item in v:
            if item is not None and not isinstance(item, (dict, list, tuple)):
                return None
    return width


def infer_structure(path, values, leaves, nodes, *, _depth=0):
    """Appends to leaves (_InferredLeaf) and nodes (_InferredNode) the
    structure of the column values found at path (the module doc says how).
    Raises ValueError past the depth limit."""
    if _depth > _MAX_DEPTH:
        raise ValueError("infer_structure: deeper than %d levels at %r" % (_MAX_DEPTH, path))
    vals = _present(values)
    keys = _dict_children(vals)
    if keys is not None:
        nodes.append(_InferredNode(path, "dict", keys, row_mask=[isinstance(v, dict) for v in values]))
        for k in keys:
            column = [(v[k] if k in v else MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure("%s.%s" % (path, _escape_key(k)), column, leaves, nodes, _depth=_depth + 1)
        return
    width = _list_width(vals)
    if width is not None:
        is_list = [isinstance(v, (list, tuple)) for v in values]
        nodes.append(_InferredNode(path, "list", list(range(width)), [len(v) if ok else 0 for v, ok in
                                                                      zip(values, is_list)], row_mask=is_list))
        for i in range(width):
            column = [(v[i] if i < len(v) else MISSING) if ok else None for v, ok in zip(values, is_list)]
            infer_structure("%s[%d]" % (path, i), column, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(_InferredLeaf(path, values, _choose_leaf_codec(values)))

