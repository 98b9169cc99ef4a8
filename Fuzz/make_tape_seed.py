#!/usr/bin/env python3
"""Writes Fuzz/corpus/tape-three-blocks.tape: a tape file of three blocks (twelve quotes and a gap)
made by a second implementation of the format (this one, with the zstd command line), so the tape's
reader is checked against the format as documented in Sources/Tape/TapeBlock.swift and
Sources/Tape/TapeRecord.swift, not against its own writer. TapeFileTests reads it; scripts/fuzz seeds
FuzzTapeReader with it."""
import os, struct, subprocess, tempfile

def varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

def zigzag(value):
    return ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF

def prefixed(data):
    return varint(len(data)) + data

def fnv1a64(data):
    hash = 0xCBF29CE484222325
    for byte in data:
        hash = ((hash ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return hash

def zstd_frame(payload):
    # From a file, so the frame carries its content size; --check adds the XXH64 checksum.
    with tempfile.TemporaryDirectory() as directory:
        source, target = os.path.join(directory, "in"), os.path.join(directory, "out")
        with open(source, "wb") as f:
            f.write(payload)
        subprocess.run(["zstd", "-q", "-f", "--check", "-3", source, "-o", target], check=True)
        with open(target, "rb") as f:
            return f.read()

start = 1795185000 * 10**9  # 2026-11-20 14:30:00 UTC
out, sequence = bytearray(), 1
for block in range(3):
    payload, records = bytearray(), 0
    first_time, first_sequence = start + block * 10**9, sequence
    for i in range(4):
        time = first_time + i * 10**6
        event = ('{"ev":"Q","sym":"AAPL","bp":%d.25,"ap":%d.27,"t":%d}' % (100 + i, 100 + i, time // 10**6)).encode()
        payload += bytes([1]) + varint(zigzag(time - first_time)) + varint(sequence - first_sequence)
        payload += prefixed(b"Q") + prefixed(b"AAPL") + prefixed(event)
        last_time, last_sequence, sequence, records = time, sequence, sequence + 1, records + 1
    if block == 1:  # a gap of 1 ms, 5 ms into the block
        payload += bytes([2]) + varint(zigzag(5 * 10**6)) + varint(zigzag(10**6))
        records, last_time = records + 1, first_time + 6 * 10**6
    frame = zstd_frame(bytes(payload))
    header = b"RTB1" + struct.pack("<IIIqqQQQ", len(frame), len(payload), records, first_time, last_time, first_sequence, last_sequence, 0)
    out += header + struct.pack("<Q", fnv1a64(header)) + frame
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "tape-three-blocks.tape")
with open(path, "wb") as f:
    f.write(out)
print(f"{path}: {len(out)} bytes")
