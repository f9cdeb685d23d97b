"""Minimal reader/writer for the safetensors format (header JSON + raw little-endian bytes).

Own code rather than the ``safetensors`` package so that bfloat16 works with plain numpy
(through ``ml_dtypes``, which JAX ships) and so that tensors are read one at a time: a shard
is never materialised as a whole, and (unlike a memory map, whose touched pages stay in the
process's resident set until it is closed) a tensor's bytes are freed once it is converted.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable, Iterator

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_header(path: str) -> tuple[dict, int]:
  """Returns (header without ``__metadata__``, byte offset of the data section)."""
  with open(path, "rb") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(size))
  header.pop("__metadata__", None)
  return header, 8 + size


def tensor_shapes(path: str) -> dict[str, tuple[int, ...]]:
  header, _ = read_header(path)
  return {k: tuple(v["shape"]) for k, v in header.items()}


# XLA:CPU adopts a host buffer without copying it when the buffer is aligned to this many
# bytes (``jax.device_put`` of such an array aliases it), so tensors are read into aligned
# buffers: loading then holds one copy of each weight, not a read buffer plus a device copy.
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
  """An uninitialised C-contiguous array whose data starts on an ``ALIGNMENT``-byte boundary."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + ALIGNMENT, np.uint8)
  offset = (-raw.ctypes.data) % ALIGNMENT
  return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def iter_tensors(path: str, names: Iterable[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
  """Yields ``(name, array)``, each array freshly read from the file into an aligned buffer
  (see :func:`aligned_empty`) owned by the caller."""
  header, start = read_header(path)
  with open(path, "rb") as f:
    for name in (header if names is None else names):
      info = header[name]
      if info["dtype"] not in _DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
      dtype = _DTYPES[info["dtype"]]
      begin, end = info["data_offsets"]
      shape = tuple(info["shape"])
      array = aligned_empty(shape, dtype)
      if array.nbytes != end - begin:
        raise ValueError(f"{path}: tensor {name!r} has {end - begin} bytes, expected "
                         f"{array.nbytes} for shape {list(shape)} {info['dtype']}")
      f.seek(start + begin)
      if f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != array.nbytes:
        raise ValueError(f"{path}: tensor {name!r} is truncated (file shorter than its header "
                         "says)")
      yield name, array


def write(path: str, tensors: dict[str, np.ndarray], *,
          metadata: dict[str, str] | None = None) -> None:
  """Writes ``tensors`` (name -> array) to ``path`` in safetensors format."""
  header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
  offset = 0
  for name, array in tensors.items():
    dtype = np.dtype(array.dtype)
    if dtype not in _NAMES:
      raise ValueError(f"tensor {name!r}: unsupported dtype {dtype}")
    nbytes = array.size * dtype.itemsize
    header[name] = {"dtype": _NAMES[dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for array in tensors.values():
      little_endian = array.dtype.newbyteorder("<")
      f.write(np.ascontiguousarray(array).astype(little_endian, copy=False).tobytes())
  os.replace(tmp, path)
