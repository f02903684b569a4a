"""hfio.py — a tiny safetensors reader/writer (numpy only) and Hugging Face
model-folder helpers (config.json + model.safetensors), for the PyTorch
reference tests. Written from the format description:

    [8 bytes little-endian u64 N][N bytes JSON header][data]
    header = {name: {"dtype": "F32"|"BF16"|..., "shape": [...],
                     "data_offsets": [begin, end]}, "__metadata__": {...}}
    offsets are relative to the start of the data section.
"""
import json
import os
import struct

import numpy as np

try:
    import torch
except ImportError:  # the reader/writer work without torch (numpy arrays)
    torch = None

_NP_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_,
}


def bf16_bits_to_f32(bits):
    """uint16 array of bfloat16 bit patterns -> float32 array."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (NaN kept NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    r = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = 0x7FC0
    return r


def round_to_bf16(x):
    """float32 array rounded to the nearest bf16 value, returned as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def read_safetensors_np(path):
    """Returns (dict name -> float32/int numpy array, metadata dict).
    BF16 tensors are converted to float32."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError(f"{path}: header length {n} beyond end of file")
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    data = memoryview(buf)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        shape = tuple(int(s) for s in info["shape"])
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(data)):
            raise ValueError(f"{path}: {name} data_offsets {b},{e} outside data ({len(data)})")
        raw = data[b:e]
        count = int(np.prod(shape)) if shape else 1
        if dt == "BF16":
            if e - b != 2 * count:
                raise ValueError(f"{path}: {name} size mismatch")
            arr = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2")).reshape(shape)
        elif dt in _NP_DTYPES:
            npdt = np.dtype(_NP_DTYPES[dt]).newbyteorder("<")
            if e - b != npdt.itemsize * count:
                raise ValueError(f"{path}: {name} size mismatch")
            arr = np.frombuffer(raw, dtype=npdt).reshape(shape).astype(_NP_DTYPES[dt])
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {dt}")
        out[name] = np.array(arr)  # own the memory
    return out, meta


def write_safetensors_np(path, tensors, dtype="F32", metadata=None):
    """tensors: dict name -> array-like (numpy or torch). dtype "F32" or "BF16"
    (floating tensors are converted; BF16 rounds to nearest even)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = tensors[name]
        if torch is not None and isinstance(a, torch.Tensor):
            a = a.detach().to("cpu")
            a = a.double().numpy() if a.is_floating_point() else a.numpy()
        a = np.asarray(a)
        if dtype == "BF16":
            b = f32_to_bf16_bits(a.astype(np.float32)).astype("<u2").tobytes()
            dt = "BF16"
        elif dtype == "F32":
            b = np.ascontiguousarray(a, dtype="<f4").tobytes()
            dt = "F32"
        else:
            raise ValueError(f"unsupported write dtype {dtype}")
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data section to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path, dtype=None):
    """dict name -> torch tensor (float32, or `dtype` when given)."""
    arrs, _ = read_safetensors_np(path)
    out = {}
    for k, a in arrs.items():
        t = torch.from_numpy(a)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[k] = t
    return out


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    write_safetensors_np(path, tensors, dtype=dtype, metadata=metadata)


def read_hf_folder(d, dtype=None):
    """Returns (config dict, dict name -> torch tensor)."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(os.path.join(d, "model.safetensors"), dtype=dtype)


def write_hf_folder(d, config, tensors, dtype="F32"):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype=dtype,
                      metadata={"format": "pt"})
