"""Wire codec for core.rpc: msgpack, with numpy arrays and torch tensors as raw buffers.

An array travels as a msgpack ExtType whose body is
    u32 little-endian header length | msgpack header [kind, dtype, shape] | raw C-order bytes
so the receiver rebuilds it with one copy and no pickle. Only plain numeric/bool dtypes are
accepted: an object dtype would need pickle, and a header whose byte count disagrees with
its shape is rejected, so a hostile peer cannot make the decoder allocate or execute anything
beyond the payload it already sent.
"""
from __future__ import annotations

import functools
import math
import struct
import sys
from typing import Any

import msgpack

EXT_NDARRAY = 1
EXT_TENSOR = 2
_HEADER_LEN = struct.Struct("<I")
_MAX_DIMS = 32
# numpy dtype kinds that are plain fixed-size values: bool, signed, unsigned, float, complex.
_ALLOWED_KINDS = frozenset("biufc")


class CodecError(ValueError):
    """A payload that cannot be encoded or decoded (bad type, corrupt header, garbage bytes)."""


def _numpy():
    """numpy, imported when an array is sent or received: a payload of plain values never needs it
    (command-line clients answer faster without its ~0.1 s import)."""
    import numpy

    return numpy


def _torch():
    try:
        import torch
    except ImportError:  # torch is a dependency of the suite, but the codec works without it
        return None
    return torch


def _array_ext(code: int, array, dtype_name: str) -> msgpack.ExtType:
    array = _numpy().ascontiguousarray(array)
    header = msgpack.packb([dtype_name, list(array.shape)])
    return msgpack.ExtType(code, _HEADER_LEN.pack(len(header)) + header + array.tobytes())


def _default(obj: Any) -> Any:
    np = sys.modules.get("numpy")  # if numpy was never imported, obj cannot be an array
    if np is not None and isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _ALLOWED_KINDS:
            raise CodecError(f"cannot send a numpy array of dtype {obj.dtype} (only numeric/bool dtypes)")
        return _array_ext(EXT_NDARRAY, obj, obj.dtype.str)
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    torch = sys.modules.get("torch")  # if torch was never imported, obj cannot be a tensor
    if torch is not None and isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: ship the raw 16-bit words
            return _array_ext(EXT_TENSOR, tensor.view(torch.int16).numpy(), dtype_name)
        return _array_ext(EXT_TENSOR, tensor.numpy(), dtype_name)
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise CodecError(f"cannot encode a value of type {type(obj).__name__}")


@functools.lru_cache(maxsize=256)
def _array_header(code: int, header: bytes) -> tuple[Any, tuple[int, ...], int, Any]:
    """(numpy dtype, shape, byte count of the body, torch dtype or None) of an array's header, or CodecError.
    Cached by the header's bytes (a failure is not cached): a stream of updates repeats the same few
    headers, and parsing and checking one cost more than copying a small array (~7 of ~11 us per array)."""
    try:
        dtype_name, shape = msgpack.unpackb(header)
    except Exception as e:
        raise CodecError(f"corrupt array header: {e}") from None
    if not isinstance(dtype_name, str) or not isinstance(shape, list) or len(shape) > _MAX_DIMS \
            or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CodecError("array header must be [dtype: str, shape: list of non-negative ints]")
    np = _numpy()
    torch_dtype = None
    if code == EXT_NDARRAY:
        try:
            dtype = np.dtype(dtype_name)
        except TypeError:
            raise CodecError(f"unknown numpy dtype {dtype_name!r}") from None
    else:
        torch = _torch()
        if torch is None:
            raise CodecError("received a torch tensor but torch is not installed")
        torch_dtype = getattr(torch, dtype_name, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise CodecError(f"unknown torch dtype {dtype_name!r}")
        # bfloat16 travels as its raw 16-bit words (numpy has no bfloat16)
        dtype = np.dtype("<i2") if torch_dtype == torch.bfloat16 else \
            torch.empty(0, dtype=torch_dtype).numpy().dtype
    if dtype.kind not in _ALLOWED_KINDS:
        raise CodecError(f"refusing array dtype {dtype} (only numeric/bool dtypes)")
    # exact ints: no int64 overflow, no numpy call per array
    return dtype, tuple(shape), math.prod(shape) * dtype.itemsize, torch_dtype


def _ext_hook(code: int, data: bytes) -> Any:
    if code not in (EXT_NDARRAY, EXT_TENSOR):
        raise CodecError(f"unknown msgpack extension type {code}")
    if len(data) < _HEADER_LEN.size:
        raise CodecError("array payload shorter than its header length")
    (header_len,) = _HEADER_LEN.unpack_from(data)
    start = _HEADER_LEN.size + header_len
    if start > len(data):
        raise CodecError("array header length runs past the payload")
    dtype, shape, expected, torch_dtype = _array_header(code, data[_HEADER_LEN.size:start])
    body = memoryview(data)[start:]
    if expected != len(body):
        raise CodecError(f"array of shape {shape} and dtype {dtype} needs {expected} bytes, got {len(body)}")
    # copy: the receiver owns a writable array, independent of the message buffer
    array = _numpy().frombuffer(body, dtype=dtype).reshape(shape).copy()
    if torch_dtype is None:
        return array
    torch = _torch()
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if torch_dtype == torch.bfloat16 else tensor


def encoded_arrays(arrays: dict[str, Any]) -> dict[str, msgpack.ExtType]:
    """Each array (or tensor) of `arrays` encoded now, as `encode` would encode it: a value sent in many
    payloads (fl-server's round model, in every client's task) is then serialised once, and each payload
    only copies its bytes. The receiver decodes the arrays as if they had been sent as they were."""
    out = {}
    for name, value in arrays.items():
        ext = _default(value)
        if not isinstance(ext, msgpack.ExtType):
            raise CodecError(f"{name!r} is a {type(value).__name__}, not an array or tensor")
        out[name] = ext
    return out


def encode(obj: Any) -> bytes:
    """Serialise a msgpack-able value (dicts, lists, str, bytes, numbers, arrays, tensors)."""
    try:
        return msgpack.packb(obj, default=_default, use_bin_type=True)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"cannot encode payload: {e}") from None


def decode(data: bytes) -> Any:
    """Inverse of `encode`; raises CodecError on anything that is not a well-formed payload."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except CodecError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise CodecError(f"cannot decode payload ({len(data)} bytes): {type(e).__name__}: {e}") from None
