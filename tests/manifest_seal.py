"""tests/manifest_seal.py — the checkpoint manifest's own checksum, written
again in Python from the format's description (docs: "manifest_checksum"):
mix64 over 8-byte little-endian words, then the tail word and the length.
reseal(path) seals an edited manifest again, as a writer of that text would:
the tests use it to make damage that only the structural check can find.

    python3 tests/manifest_seal.py MANIFEST...   reseal each file in place
"""
import sys

M64 = (1 << 64) - 1
KEY = b'"manifest_checksum": "'


def _mix(h, w):
    h ^= w
    h = (h * 0x9E3779B97F4A7C15) & M64
    return h ^ (h >> 29)


def mix64(data):
    h = 0x6A09E667F3BCC909
    n8 = len(data) // 8 * 8
    for i in range(0, n8, 8):
        h = _mix(h, int.from_bytes(data[i:i + 8], "little"))
    tail = int.from_bytes(data[n8:].ljust(8, b"\0"), "little")
    return _mix(_mix(_mix(h, tail), len(data)), 0x2545F4914F6CDD1D)


def reseal(path):
    text = open(path, "rb").read()
    at = text.rindex(KEY)
    body = text[:at]
    open(path, "wb").write(body + KEY + b"%016x" % mix64(body) + b'"\n}\n')


if __name__ == "__main__":
    for p in sys.argv[1:]:
        reseal(p)
