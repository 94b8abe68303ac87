"""The rpc wire codec: arrays and tensors round-trip bit-exactly; garbage and unsafe dtypes are refused."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch

from mlsyskit.core.rpc_codec import EXT_NDARRAY, CodecError, decode, encode, encoded_arrays


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int64", "uint16", "bool", "complex64"])
def test_numpy_roundtrip_keeps_dtype_shape_and_bytes(dtype):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal((3, 4, 5)) * 10).astype(dtype)
    back = decode(encode({"w": array}))["w"]
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()
    back[0, 0, 0] = 0  # the receiver owns a writable copy


def test_non_contiguous_and_empty_arrays():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert np.array_equal(decode(encode(array)), array)
    empty = np.zeros((0, 7), dtype=np.int32)
    assert decode(encode(empty)).shape == (0, 7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8])
def test_torch_roundtrip(dtype):
    tensor = (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5).to(dtype)
    back = decode(encode([tensor, {"nested": tensor.t()}]))
    assert isinstance(back[0], torch.Tensor) and back[0].dtype == dtype
    assert torch.equal(back[0], tensor) and torch.equal(back[1]["nested"], tensor.t())


def test_numpy_scalars_and_tuples_become_plain_values():
    assert decode(encode({"a": np.float32(1.5), "b": (1, 2), 3: "int key"})) == {"a": 1.5, "b": [1, 2], 3: "int key"}


def test_object_arrays_and_unknown_types_are_refused():
    with pytest.raises(CodecError, match="dtype object"):
        encode(np.array([object()], dtype=object))
    with pytest.raises(CodecError, match="cannot encode a value of type"):
        encode({"f": lambda: 0})


def test_garbage_and_forged_headers_are_refused():
    with pytest.raises(CodecError):
        decode(b"\xc1\xff\x00garbage")
    header = msgpack.packb(["<f4", [1000, 1000]])
    forged = msgpack.ExtType(EXT_NDARRAY, len(header).to_bytes(4, "little") + header + b"\0" * 8)
    with pytest.raises(CodecError, match="needs 4000000 bytes, got 8"):
        decode(msgpack.packb(forged))
    header = msgpack.packb(["|O", [1]])
    pickled = msgpack.ExtType(EXT_NDARRAY, len(header).to_bytes(4, "little") + header + b"\0" * 8)
    with pytest.raises(CodecError, match="refusing array dtype object"):
        decode(msgpack.packb(pickled))
    with pytest.raises(CodecError, match="unknown msgpack extension"):
        decode(msgpack.packb(msgpack.ExtType(42, b"x")))


def test_a_shape_whose_size_overflows_int64_is_refused_not_wrapped_to_the_body_length() -> None:
    header = msgpack.packb(["<f4", [2**32, 2**32]])  # 2**64 elements: 0 in int64, as the empty body
    payload = len(header).to_bytes(4, "little") + header
    with pytest.raises(CodecError, match="needs"):
        decode(msgpack.packb(msgpack.ExtType(EXT_NDARRAY, payload)))


def test_arrays_encoded_once_give_the_same_bytes_and_decode_as_the_arrays() -> None:
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((5, 3)).astype(np.float32), "b": np.arange(4, dtype=np.int64),
              "t": torch.arange(6, dtype=torch.float64).reshape(2, 3), "odd": np.asfortranarray(np.ones((2, 3)))}
    ready = encoded_arrays(arrays)
    for message in ({"weights": arrays, "round": 3}, [arrays, arrays]):
        swapped = {"weights": ready, "round": 3} if isinstance(message, dict) else [ready, ready]
        assert encode(swapped) == encode(message)  # what a receiver gets cannot tell them apart
    back = decode(encode({"weights": ready}))["weights"]
    assert back["w"].dtype == np.float32 and np.array_equal(back["w"], arrays["w"])
    assert isinstance(back["t"], torch.Tensor) and torch.equal(back["t"], arrays["t"])
    with pytest.raises(CodecError, match="not an array"):
        encoded_arrays({"x": (1, 2)})
    with pytest.raises(CodecError):
        encoded_arrays({"x": 1.5})


def test_a_known_header_still_checks_its_body() -> None:
    good = encode({"w": np.ones((3, 4), np.float32)})
    assert decode(good)["w"].shape == (3, 4)  # the header is now parsed and cached
    with pytest.raises(CodecError, match="needs 48 bytes"):
        decode(_with_body_shortened(good, 4))
    again = decode(good)["w"]
    again[0, 0] = 5.0  # writable, and not shared with the cache or the message
    assert decode(good)["w"][0, 0] == 1.0


def _with_body_shortened(message: bytes, by: int) -> bytes:
    """The same {"w": array} message with the array's ext body `by` bytes shorter (its ext length fixed)."""
    payload = msgpack.unpackb(message, ext_hook=lambda code, data: msgpack.ExtType(code, data[:-by]), raw=False)
    return msgpack.packb(payload, use_bin_type=True)
