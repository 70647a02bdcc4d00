"""ecstore.mooncake.structured_object_store against Mooncake's own
mooncake.structured_object_store (the pinned wheel): the same columns go
through both, and every decision (accepted, codec, normalized type,
metadata) and every inferred node and leaf (path, type, children, lengths,
row mask, values with MISSING where a key was absent) must agree.  Then the
behaviours Mooncake's TestCodecInference checks, on ecstore's module
alone, so the facts stay pinned if the wheel is not there.  A missing wheel
fails the differential half (it is a pinned test dependency)."""

import sys

import numpy as np
import pytest
import torch

import ecstore.mooncake.structured_object_store as ours


def _theirs():
    try:
        import mooncake.structured_object_store as mod
    except ImportError as e:
        pytest.fail("mooncake.structured_object_store is not importable in %s (%s): install the pin of "
                    "ec_connector/python/requirements-test.txt" % (sys.executable, e))
    return mod


class _Odd:
    """A value no codec takes."""


COLUMNS = {
    "tensors": [torch.tensor([1, 2]), torch.tensor([3])],
    "tensors-mixed-dtype": [torch.tensor([1.0]), torch.tensor([1])],
    "tensors-mixed-ndim": [torch.tensor([1]), torch.tensor([[1, 2]])],
    "tensors-and-none": [torch.zeros(2, 3), None, torch.ones(1, 3)],
    "numeric-lists": [[1, 2, 3], [4, 5]],
    "numeric-tuples-floats": [(1.5, 2), (3,)],
    "bool-lists": [[True, False], [True]],
    "mixed-lists": [[1, "a"], [2]],
    "empty-lists": [[], []],
    "nested-numeric-lists": [[[1, 2], [3, 4]], [[5, 6]]],
    "numpy-arrays": [np.arange(3), np.arange(4, dtype=np.float32)],
    "numpy-object-arrays": [np.array(["a", "b"]), np.arange(2)],
    "bytes": [b"hello", bytearray(b"world"), memoryview(b"!")],
    "media-lists": [[b"png1", b"png2"], [b"jpg"]],
    "empty-media-lists": [[], [b"x"]],
    "text": ["hello", "world"],
    "text-with-none": ["hello", None, "world"],
    "json-like-dict-rows": [{"a": 1}, {"b": 2}],
    "json-late-odd": [{"ok": i} for i in range(200)] + [_Odd()],
    "scalars": [1, 2.0, 3],
    "bools": [True, False],
    "numpy-scalars": [np.int8(1), np.float64(2.5)],
    "big-int": [1, 1 << 70],
    "odd-objects": [_Odd(), _Odd()],
    "text-and-number": ["a", 1],
    "empty": [],
    "all-none": [None, None, None],
    "flat": ["a", "b", "c"],
    "dicts": [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}],
    "dicts-none-rows": [{"x": 1}, None, {"x": 3}],
    "nested-dicts": [{"a": {"b": 1}}, {"a": {"b": 2}}],
    "list-of-dicts": [[{"k": 1}], [{"k": 2}]],
    "list-of-dicts-with-none": [[{"k": 1}, None], [{"k": 2}, None]],
    "ragged-list-of-dicts": [[{"k": 1}, {"k": 2}], [{"k": 3}], None, []],
    "missing-vs-none": [{"x": None}, {"y": 2}, None],
    "dot-keys": [{"a.b": 1}, {"a.b": 2}],
    "escaped-keys": [{"a[0]": 1, "c\\d": 2}, {"a[0]": 3}],
    "non-str-keys": [{1: "a"}, {2: "b"}],
    "many-keys": [{"k%d" % i: i for i in range(65)}],
    "sixty-four-keys": [{"k%d" % i: i for i in range(64)}],
    "long-lists-of-dicts": [[{"a": 1}] * 9],
    "eight-long-list": [[{"a": i} for i in range(8)]],
    "list-of-lists": [[[1], [2, 3]], [[4]]],
    "tuple-of-dicts": [({"a": 1}, {"a": 2})],
    "dict-of-tensors": [{"t": torch.ones(2)}, {"t": torch.zeros(3)}],
    "dict-of-mixed": [{"v": 1}, {"v": "s"}],
}


def _values(vals, missing):
    return ["<MISSING>" if v is missing else ("<None>" if v is None else id(v)) for v in vals]


def _decision(d):
    return (d.accepted, d.codec, d.normalized_type, dict(d.metadata))


def _infer(mod, col):
    leaves, nodes = [], []
    mod.infer_structure("r", col, leaves, nodes)
    return ([(n.path, n.node_type, list(n.children), n.lengths, n.row_mask) for n in nodes],
            [(leaf.path, _values(leaf.values, mod.MISSING), _decision(leaf.decision)) for leaf in leaves])


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_same_decisions_and_structure_as_mooncake(name):
    theirs = _theirs()
    col = COLUMNS[name]
    assert _decision(ours._choose_leaf_codec(col)) == _decision(theirs._choose_leaf_codec(col))
    assert _infer(ours, col) == _infer(theirs, col)


def test_depth_limit_and_escapes_as_mooncake():
    theirs = _theirs()
    deep = 1
    for _ in range(40):
        deep = {"a": deep}
    for mod in (ours, theirs):
        with pytest.raises(ValueError):
            mod.infer_structure("r", [deep, deep], [], [])
    ok = 1
    for _ in range(32):
        ok = {"a": ok}
    assert _infer(ours, [ok]) == _infer(theirs, [ok])
    for k in ("simple", "a.b", "a[0]", "a\\b", "x.y[z]\\", ""):
        assert ours._escape_key(k) == theirs._escape_key(k), k


def test_codec_inference_behaviours():
    """What Mooncake's TestCodecInference asserts, on ecstore's module."""
    d = ours._choose_leaf_codec
    assert (d([torch.tensor([1, 2]), torch.tensor([3])]).accepted, d([torch.tensor([3])]).codec) == (True,
                                                                                                   "ragged_tensor")
    assert not d([torch.tensor([1.0]), torch.tensor([1])]).accepted
    assert d([[1, 2, 3], [4, 5]]).codec == "typed_ragged"
    assert d([b"hello", b"world"]).codec == "bytes_ragged"
    assert d(["hello", None, "world"]).codec == "utf8_ragged" and d(["hello", None]).accepted
    assert d([{"a": 1}, {"b": 2}]).codec == "msgpack_ragged"
    assert d([1, 2.0, 3]).codec == "ndarray" and d([1, 2.0, 3]).metadata == {"dtype": "float64"}
    assert not d([object(), object()]).accepted
    assert not d([]).accepted and not d([None, None, None]).accepted
    leaves, nodes = [], []
    ours.infer_structure("r", [{"x": None}, {"y": 2}, None], leaves, nodes)
    assert nodes[0].row_mask == [True, True, False]
    x = next(leaf for leaf in leaves if leaf.path == "r.x")
    assert x.values[0] is None and x.values[1] is ours.MISSING and x.values[2] is None
    assert repr(ours.MISSING) == "<MISSING>"
    leaves, nodes = [], []
    ours.infer_structure("r", [[{"k": 1}], [{"k": 2}]], leaves, nodes)
    assert [(n.node_type, n.lengths) for n in nodes] == [("list", [1, 1]), ("dict", None)]
    assert [leaf.path for leaf in leaves] == ["r[0].k"]
    assert ours._escape_key("a.b") == "a\\.b" and ours._escape_key("a[0]") == "a\\[0]"
