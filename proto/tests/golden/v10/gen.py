#!/usr/bin/env python3
"""Independent generator for the dlcp wire version 10 golden vectors.

This script does NOT use the Rust encoder. It writes every header field at the
offset given by the layout table in `proto/src/wire/mod.rs` (module docs),
appends the payload (a HELLO's is its settings, `proto/src/wire/settings.rs`),
and computes the tag with Python's `cryptography` (Debian: python3-cryptography),
following the construction in `proto/src/wire/mac.rs`:

    PRK = HKDF-Extract(SHA-256, salt = KEY_SALT, secret)
    key = HKDF-Expand(PRK, KEY_INFO || job || src || session, 16)
          (integers big-endian, 4, 4 and 8 bytes)
    nonce = 00000000 || packet (big-endian)
    tag = AES-128-GCM(key, nonce, plaintext = header, aad = payload).tag

A datagram of `auth` 0 (packet_auth = "none") carries no tag.

Version 10 (issue 16: control per peer below one packet per op) differs
from version 9 in: packet type 8 ACK, receiver to owner, acknowledging the
exact all-gathers of several ops it received whole: class 7, phase 2
(all-gather), `run` the run of every entry, `op`, `tensor`, `chunk_index`,
`required`, `budget_ppm` and `seq` 0, dtype 0 and kind 0, no flags,
`chunk_count` the number of entries (1 to 64) and a payload of 20 bytes per
entry: the op's sequence number (8 bytes), its tensor id (4), the `seq` of
the DATA that completed the transfer (4) and the microseconds the
acknowledgement was held before it left (4), all big-endian; and the key
schedule's salt and info strings, which name version 10. The header layout is
version 9's.

Version 9 (issue 16: credit carried by every packet) differed from version 8
in: the header grows to 84 bytes; offset 80 holds `credit` (4 bytes), on
every packet but HELLO and GOODBYE (which carry 0) the low 32 bits of the
cumulative DATA limit the sender grants the destination (0: none); the
payload starts at offset 84; and the key schedule's salt and info strings,
which name version 9.

Version 8 (issue 16: control that does not grow with the job) differed from
version 7 in: the DATA flag LAST (0x80, the last bit), "the last DATA of its
sender's first pass of the transfer", on which the receiver decides as on a
PROBE; a BITMAP's `seq` echoes the PROBE round it answers or, answering a
LAST DATA, that DATA's `seq` (its data sequence number); and the key
schedule's salt and info strings, which name version 8. The header layout is
version 7's.

Version 7 (issue 18: the other collectives) differed from version 6 in: the
high four bits of byte 15 (`kind`) name the op's collective: 0 allreduce,
1 reduce-scatter, 2 allgather, 3 broadcast, 4 barrier (5-15 refused); the
packets of a collective are of the phases it has (reduce-scatter and barrier:
scatter only; allgather: gather only; allreduce and broadcast: both), and one that does not
reduce (allgather, broadcast, barrier) carries sum; and the key schedule's
salt and info strings, which name version 7. The header layout is version 6's.

Version 6 (issue 18: f16/bf16 and average) differed from version 5 in: byte 15,
reserved before, is `kind`: the op's reduction in its low four bits (0 sum,
1 average) and its collective in its high four (0 allreduce, the only one
defined); the `dtype` byte (0 f32, 1 f16, 2 bf16) is the op's element type,
carried by every packet of the op (DATA payloads are elements of it, 2 bytes
for f16 and bf16); HELLO, GRANT and GOODBYE carry 0 in both; and the key
schedule's salt and info strings, which name version 6.

Version 5 (failure notices) differed from version 4 in: the DONE flag
FAILED (0x40), "the sender failed this op", whose payload is exactly one byte,
the reason code (0 other, 1 timeout, 2 deadline, 3 peer left, 4 peer
incompatible, 5 peer failed; a receiver reads unknown codes as other), with
chunk_index 0 and never MASK_EMPTY; and the key schedule's salt and info
strings, which name version 5. The header layout is version 4's.

Version 4 (issue 15, op identity) differed from version 3 in: no generation
in the header (incarnations are random sessions, verified by a HELLO
challenge); `payload_len` and `auth` move to offsets 12 and 14 (15 reserved);
a 64-bit `run` at offset 56 (the run id the job's daemons agreed; 0 on HELLO,
GRANT and GOODBYE); type 7 GOODBYE (phase 0, class 7, no payload); a 48-byte
HELLO payload (settings, settings digest, generation for people, run flags
and nonce, the receiver's nonce echoed, challenge and echo); the key schedule without the generation and
with version 4 salt and info strings.

`proto/tests/wire_golden.rs` builds the same packets with `wire::encode` and
compares byte for byte, both ways. The .hex files are committed: the tests do
not need Python. Regenerate with:

    python3 proto/tests/golden/v10/gen.py   # writes proto/tests/golden/v10/*.hex
"""
import os
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = 10
HEADER_LEN = 84
KEY_SALT = b"dlcp wire v10 packet authentication"
KEY_INFO = b"dlcp v10 aes-128-gmac sender key"
SECRET = b"dlcp golden secret v10"

DATA, PROBE, BITMAP, DONE, HELLO, GRANT, GOODBYE, ACK = 1, 2, 3, 4, 5, 6, 7, 8
REPAIR, COMPLETE, MASK_EMPTY, REQUIRED, REQUEST, BACKLOG, FAILED, LAST = (
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80)
OTHER, TIMEOUT, DEADLINE, PEER_LEFT, PEER_INCOMPATIBLE, PEER_FAILED = 0, 1, 2, 3, 4, 5
NONE, SCATTER, GATHER = 0, 1, 2
F32, F16, BF16 = 0, 1, 2
SUM, AVERAGE = 0, 1
ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST, BARRIER = 0, 1, 2, 3, 4
AUTH_NONE, AUTH_GMAC = 0, 1


def put(buf, off, size, value):
    """Big-endian `value` into buf[off:off+size]."""
    assert 0 <= value < (1 << (8 * size)), (off, size, value)
    for i in range(size):
        buf[off + i] = (value >> (8 * (size - 1 - i))) & 0xFF


def header(ty, flags, cls, phase, dtype, job, run, src, dst, op, tensor,
           chunk_index, chunk_count, required, budget_ppm, seq, payload_len, auth,
           session, packet, reduce=SUM, collective=ALLREDUCE, credit=0):
    h = bytearray(HEADER_LEN)
    put(h, 0, 2, 0xD1C9)        # magic
    put(h, 2, 1, VERSION)       # version
    put(h, 3, 1, ty)            # type
    put(h, 4, 1, flags)         # flags
    put(h, 5, 1, cls)           # class
    put(h, 6, 1, phase)         # phase
    put(h, 7, 1, dtype)         # dtype
    put(h, 8, 4, job)           # job
    put(h, 12, 2, payload_len)  # payload_len
    put(h, 14, 1, auth)         # auth
    put(h, 15, 1, collective << 4 | reduce)  # kind
    put(h, 16, 4, src)          # src
    put(h, 20, 4, dst)          # dst
    put(h, 24, 8, op)           # op
    put(h, 32, 4, tensor)       # tensor
    put(h, 36, 4, chunk_index)  # chunk_index
    put(h, 40, 4, chunk_count)  # chunk_count
    put(h, 44, 4, required)     # required
    put(h, 48, 4, budget_ppm)   # budget_ppm
    put(h, 52, 4, seq)          # seq
    put(h, 56, 8, run)          # run
    put(h, 64, 8, session)      # session
    put(h, 72, 8, packet)       # packet
    put(h, 80, 4, credit)       # credit (version 9)
    return bytes(h)


def sender_key(job, src, session):
    info = KEY_INFO + struct.pack(">IIQ", job, src, session)
    return HKDF(algorithm=hashes.SHA256(), length=16, salt=KEY_SALT, info=info).derive(SECRET)


def packet(payload, auth=AUTH_GMAC, **fields):
    h = header(payload_len=len(payload), auth=auth, **fields)
    if auth == AUTH_NONE:
        return h + payload
    key = sender_key(fields["job"], fields["src"], fields["session"])
    nonce = bytes(4) + struct.pack(">Q", fields["packet"])
    # encrypt() returns ciphertext || tag; the ciphertext of the header is dropped.
    tag = AESGCM(key).encrypt(nonce, h, payload)[-16:]
    return h + payload + tag


def settings(version, auth, chunk_bytes, flow_window, digest, generation, run_flags, run_nonce,
             run_echo, challenge, echo):
    return struct.pack(">BBHIQIB3xQQQQ", version, auth, flow_window, chunk_bytes, digest, generation,
                       run_flags, run_nonce, run_echo, challenge, echo)


COMMON = dict(job=0x01020304, run=0x0A0B0C0D0E0F1011, src=1, dst=2, op=0x1122334455667788,
              tensor=0xCAFEBABE, session=0x5E5510A0B0C0D0E0)

# f32 little-endian: 1.0, -2.5
F32_PAYLOAD = bytes.fromhex("0000803f") + bytes.fromhex("000020c0")

VECTORS = {
    "data": packet(F32_PAYLOAD, ty=DATA, flags=0, cls=3, phase=SCATTER, dtype=F32, **COMMON,
                   chunk_index=5, chunk_count=10, required=4, budget_ppm=10_000, seq=41, packet=0,
                   credit=0x00000123),
    "data_repair_bf16": packet(bytes([0x80, 0x3F, 0x20, 0xC0]), ty=DATA, flags=REPAIR | REQUIRED, cls=6,
                               phase=GATHER, dtype=BF16, **COMMON, chunk_index=9,
                               chunk_count=10, required=10, budget_ppm=1_000_000, seq=0xFFFFFFFF,
                               packet=0xFFFFFFFFFFFFFFFE),
    # f16 little-endian: 1.0 = 0x3C00, -2.5 = 0xC100, 65504 = 0x7BFF; an average.
    "data_f16_average": packet(bytes([0x00, 0x3C, 0x00, 0xC1, 0xFF, 0x7B]), ty=DATA, flags=REQUIRED, cls=2,
                               phase=SCATTER, dtype=F16, reduce=AVERAGE, **COMMON, chunk_index=3,
                               chunk_count=10, required=10, budget_ppm=0, seq=7, packet=12),
    # Control packets of an op carry its dtype and reduction too.
    "bitmap_bf16_average": packet(bytes([0x0F]), ty=BITMAP, flags=0, cls=7, phase=GATHER, dtype=BF16,
                                  reduce=AVERAGE, **COMMON, chunk_index=0, chunk_count=4, required=0,
                                  budget_ppm=10_000, seq=9, packet=13),
    # Version 7: the other collectives, each in the phase it has.
    "data_reduce_scatter_average": packet(F32_PAYLOAD, ty=DATA, flags=REQUIRED, cls=1, phase=SCATTER,
                                          dtype=F32, reduce=AVERAGE, collective=REDUCE_SCATTER, **COMMON,
                                          chunk_index=2, chunk_count=10, required=10, budget_ppm=10_000,
                                          seq=0, packet=14),
    "data_allgather_f16": packet(bytes([0x00, 0x3C, 0x00, 0xC1]), ty=DATA, flags=0, cls=4, phase=GATHER,
                                 dtype=F16, collective=ALLGATHER, **COMMON, chunk_index=7, chunk_count=10,
                                 required=0, budget_ppm=10_000, seq=0, packet=15),
    "data_broadcast_bf16": packet(bytes([0x80, 0x3F, 0x20, 0xC0]), ty=DATA, flags=REQUIRED, cls=0,
                                  phase=GATHER, dtype=BF16, collective=BROADCAST, **COMMON, chunk_index=0,
                                  chunk_count=10, required=10, budget_ppm=0, seq=0, packet=16),
    "probe_barrier": packet(struct.pack(">Q", 1), ty=PROBE, flags=0, cls=7, phase=SCATTER, dtype=F32,
                            collective=BARRIER, **COMMON, chunk_index=0, chunk_count=1, required=1,
                            budget_ppm=0, seq=1, packet=17),
    "done_allgather": packet(bytes([0x04]), ty=DONE, flags=0, cls=7, phase=GATHER, dtype=F32,
                             collective=ALLGATHER, **COMMON, chunk_index=0, chunk_count=10, required=0,
                             budget_ppm=10_000, seq=2, packet=18),
    # The last DATA of a first pass: LAST (with REQUIRED and BACKLOG).
    "data_last": packet(F32_PAYLOAD, ty=DATA, flags=LAST | REQUIRED | BACKLOG, cls=2, phase=SCATTER, dtype=F32,
                        **COMMON, chunk_index=9, chunk_count=10, required=4, budget_ppm=10_000,
                        seq=0x12345678, packet=17, credit=0xFFFFFFFF),
    "data_auth_none": packet(F32_PAYLOAD, auth=AUTH_NONE, ty=DATA, flags=0, cls=3, phase=SCATTER,
                             dtype=F32, **COMMON, chunk_index=5, chunk_count=10, required=4,
                             budget_ppm=10_000, seq=0, packet=1),
    "probe": packet(struct.pack(">Q", 4242), ty=PROBE, flags=0, cls=7, phase=GATHER, dtype=F32, **COMMON,
                    chunk_index=0, chunk_count=10, required=4, budget_ppm=10_000, seq=3, packet=2,
                    credit=0x89ABCDEF),
    "bitmap": packet(bytes([0xFF, 0x0F]), ty=BITMAP, flags=0, cls=7, phase=SCATTER, dtype=F32,
                     **COMMON, chunk_index=8, chunk_count=20, required=4, budget_ppm=10_000,
                     seq=2, packet=3),
    "bitmap_complete": packet(b"", ty=BITMAP, flags=COMPLETE, cls=7, phase=SCATTER, dtype=F32,
                              **COMMON, chunk_index=0, chunk_count=20, required=4,
                              budget_ppm=10_000, seq=4, packet=4, credit=1),
    "done": packet(bytes([0xF7, 0x03]), ty=DONE, flags=0, cls=7, phase=GATHER, dtype=F32,
                   **COMMON, chunk_index=0, chunk_count=10, required=4, budget_ppm=10_000,
                   seq=5, packet=5),
    "done_mask_empty": packet(b"", ty=DONE, flags=MASK_EMPTY, cls=7, phase=GATHER, dtype=F32,
                              **COMMON, chunk_index=0, chunk_count=10, required=4,
                              budget_ppm=10_000, seq=6, packet=6),
    "done_failed": packet(bytes([TIMEOUT]), ty=DONE, flags=FAILED, cls=7, phase=SCATTER, dtype=F32,
                          **COMMON, chunk_index=0, chunk_count=10, required=4, budget_ppm=10_000,
                          seq=0, packet=10),
    # A reason code no version defines yet: a receiver reads it as OTHER.
    "done_failed_unknown": packet(bytes([0xC8]), ty=DONE, flags=FAILED, cls=7, phase=GATHER, dtype=F32,
                                  **COMMON, chunk_index=0, chunk_count=1, required=0, budget_ppm=0,
                                  seq=0, packet=11),
    "hello": packet(settings(VERSION, AUTH_GMAC, 1376, 256, 0x0123456789ABCDEF, 0xFFFFFFFE, 1,
                             0x1122334455667789, 0xC1C2C3C4C5C6C7C9, 0xA1A2A3A4A5A6A7A9,
                             0xB1B2B3B4B5B6B7B9),
                    ty=HELLO, flags=0, cls=7, phase=NONE, dtype=F32, job=0x01020304, run=0, src=3, dst=0, op=0, tensor=0,
                    chunk_index=0, chunk_count=0, required=0, budget_ppm=0, seq=77,
                    session=0xFEDCBA9876543210, packet=7),
    "grant": packet(struct.pack(">Q", 0x0000000100000040), ty=GRANT, flags=0, cls=7, phase=NONE, dtype=F32,
                    job=0x01020304, run=0, src=2, dst=1, op=0, tensor=0, chunk_index=0,
                    chunk_count=0, required=0, budget_ppm=0, seq=0, session=0x5E5520A0B0C0D0E0, packet=8,
                    credit=0x00000040),
    "grant_request": packet(struct.pack(">Q", 1000), ty=GRANT, flags=REQUEST, cls=7, phase=NONE,
                            dtype=F32, job=0x01020304, run=0, src=1, dst=2, op=0,
                            tensor=0, chunk_index=0, chunk_count=0, required=0, budget_ppm=0, seq=0,
                            session=0x5E5510A0B0C0D0E0, packet=9),
    "goodbye": packet(b"", ty=GOODBYE, flags=0, cls=7, phase=NONE, dtype=F32, job=0x01020304, run=0,
                      src=2, dst=0, op=0, tensor=0, chunk_index=0, chunk_count=0, required=0,
                      budget_ppm=0, seq=0, session=0x5E5520A0B0C0D0E0, packet=0xFFFFFFFFFFFFFFF0),
    # Version 10: two ops' all-gathers acknowledged in one ACK (run in the
    # header, one 20-byte entry per op).
    "ack": packet(struct.pack(">QIII", 0x1122334455667788, 0xCAFEBABE, 0x12345678, 25_000)
                  + struct.pack(">QIII", 0x1122334455667789, 0, 0xFFFFFFFF, 0xFFFFFFFF),
                  ty=ACK, flags=0, cls=7, phase=GATHER, dtype=F32, job=0x01020304, run=0x0A0B0C0D0E0F1011,
                  src=2, dst=1, op=0, tensor=0, chunk_index=0, chunk_count=2, required=0, budget_ppm=0,
                  seq=0, session=0x5E5520A0B0C0D0E0, packet=19, credit=0x00000080),
}

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for name, pkt in VECTORS.items():
        tag_len = 0 if pkt[14] == AUTH_NONE else 16
        h = pkt[:HEADER_LEN].hex()
        lines = [f"# {name}: {len(pkt)} bytes, generated by gen.py (do not edit by hand)",
                 f"# header ({HEADER_LEN} bytes)"]
        lines += [h[i:i + 32] for i in range(0, 2 * HEADER_LEN, 32)]
        plen = len(pkt) - HEADER_LEN - tag_len
        lines.append(f"# payload ({plen} bytes)")
        if plen > 0:
            lines.append(pkt[HEADER_LEN:HEADER_LEN + plen].hex())
        if tag_len:
            lines.append("# tag (16 bytes)")
            lines.append(pkt[-16:].hex())
        else:
            lines.append("# no tag (auth 0: packet_auth = \"none\")")
        with open(os.path.join(here, f"{name}.hex"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(name, len(pkt))
