"""Helpers for the file tests: a small safetensors writer written from the
format description (8-byte little-endian header length, JSON header,
data), independent of the library's own writer, and the CLI runner."""
import json
import os
import struct
import subprocess

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MHA = os.path.join(ROOT, "build", "mha")

_DT = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.bool_): "BOOL",
       np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8"}


def write_safetensors_raw(path, entries, metadata=None):
    """entries: dict name -> (dtype string as the format names it, shape,
    bytes): any dtype (BF16, a wrong one, a lying shape), for hostile files;
    metadata: dict of strings, or None for no __metadata__."""
    header, blobs, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, b) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> numpy array (float32/float16/bool/uint8/int8)."""
    entries = {}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        entries[name] = (_DT[a.dtype], a.shape, a.astype(a.dtype.newbyteorder("<")).tobytes())
    write_safetensors_raw(path, entries, {k: str(v) for k, v in metadata.items()} if metadata else None)


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def mha(*args, check=True):
    """Runs the CLI; returns the CompletedProcess (stdout+stderr text)."""
    p = subprocess.run([MHA] + [str(a) for a in args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError("mha %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode,
                                                           p.stderr))
    return p
