"""An op's recorded arguments rebuild the same call (replay relies on it), whichever encoder
wrote them: json's C encoder for the common case, the Python walk for non-finite floats and
dicts."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accuracy.dumper.flatten import tensors_in
from accuracy.dumpfile.argcodec import decode_call, encode_call

_POOL = [torch.full((2,), float(i)) for i in range(4)]

_leaves = st.one_of(
    st.sampled_from(_POOL),
    st.integers(-2**62, 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.sampled_from([torch.float32, torch.bfloat16, torch.int64]),
    st.sampled_from([torch.device("cpu"), torch.channels_last, torch.strided]),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
)
_values = st.recursive(_leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.tuples(inner, inner)), max_leaves=8)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, list | tuple):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(args=st.lists(_values, max_size=4),
       kwargs=st.dictionaries(st.text(min_size=1, max_size=4), _values, max_size=3))
def test_recorded_arguments_rebuild_the_call(args, kwargs):
    text = encode_call(args, kwargs)
    # placeholders number the tensors as the recorder lists the op's inputs
    inputs = tensors_in(kwargs, tensors_in(args))
    new_args, new_kwargs = decode_call(text, inputs)
    assert _same(args, new_args)
    assert new_kwargs.keys() == kwargs.keys()
    assert all(_same(kwargs[k], new_kwargs[k]) for k in kwargs)


def test_non_finite_floats_and_tensors_in_order():
    a, b, c = _POOL[:3]
    text = encode_call((a, [b, float("inf")], -0.0), {"out": c, "alpha": float("nan")})
    assert text == ('{"args":[{"__tensor__":0},[{"__tensor__":1},{"__float__":"inf"}],-0.0],'
                    '"kwargs":{"out":{"__tensor__":2},"alpha":{"__float__":"nan"}}}')
    text = encode_call((a, [b, 2.5], None, True), {"dim": [0, 1], "dtype": torch.float16})
    assert text == ('{"args":[{"__tensor__":0},[{"__tensor__":1},2.5],null,true],'
                    '"kwargs":{"dim":[0,1],"dtype":{"__dtype__":"float16"}}}')


def test_a_given_tensor_index_is_used():
    a, b = _POOL[:2]
    ids = {id(a): 7, id(b): 3}
    text = encode_call((a, [b]), {}, lambda t: ids[id(t)])
    assert text == '{"args":[{"__tensor__":7},[{"__tensor__":3}]],"kwargs":{}}'


def test_a_device_of_a_backend_not_loaded_here_rebuilds_as_privateuse1():
    """`npu:0` recorded where torch_npu (or the test device) was imported, read where it is
    not: replay on CPU rebuilds the factory call (its device is then replaced by the
    reference's) instead of failing every `arange`/`zeros`/`ones` of the device run."""
    encoded = encode_call([[2, 3]], {"device": torch.device("cpu")}, tensors_in)
    foreign = encoded.replace('"cpu"', '"musa:1"')
    _, kwargs = decode_call(foreign, [])
    assert kwargs["device"] == torch.device("privateuseone", 1)
    for bad in ('"musa:x"', '"mu sa"', '"musa:1:2"'):
        try:
            decode_call(encoded.replace('"cpu"', bad), [])
        except ValueError as e:
            assert "bad recorded argument __device__" in str(e)
        else:
            raise AssertionError(f"{bad} decoded")


def test_another_pythons_c_encoder_leaves_json_to_build_its_own(monkeypatch):
    # the encoder built once from CPython's own C constructor: where that constructor takes
    # other arguments (another Python version), json's own encode is used, never a wrong text
    import json

    from accuracy.dumpfile import argcodec

    def other_signature(*args):
        def encode(obj, level):
            return ["[]"]  # what a constructor with its arguments shifted might write
        return encode

    monkeypatch.setattr(argcodec, "c_make_encoder", other_signature)
    enc = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
    one_shot = argcodec._one_shot(enc)
    assert one_shot({"args": [1, [2]], "kwargs": {}}) == '{"args":[1,[2]],"kwargs":{}}'
