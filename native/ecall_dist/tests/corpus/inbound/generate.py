#!/usr/bin/env python3
"""Writes the corpus of incoming frame bodies (each without its 4-byte length).

The name says what the C-node must do with the frame:
  answer-*  reply (net_kernel's is_auth call);
  ignore-*  read, count, nothing to answer; the connection stays;
  close-*   malformed or over a bound: close this connection, nothing else.

The cases are the crashes found from outside (a term nested 10,000 levels,
headers claiming 0xFFFFFFFF elements) and their relatives. The tests in
../../fuzz_parsers.rs and ../../hostile.rs read every file here; a new case
is a new file. Run from this folder: python3 generate.py
"""
import struct

VERSION, PASS = 131, 112


def atom(name):
    b = name.encode()
    return bytes([119, len(b)]) + b


def pid(node, n=42):
    return bytes([88]) + atom(node) + struct.pack(">III", n, 0, 7)


def reg_send(to, node="evil@localhost"):
    return bytes([VERSION, 104, 4, 97, 6]) + pid(node) + atom("") + atom(to)


def is_auth(node="evil@localhost"):
    ref = bytes([90, 0, 3]) + atom(node) + struct.pack(">IIII", 7, 1, 2, 3)
    return bytes([VERSION, 104, 3]) + atom("$gen_call") + bytes([104, 2]) + pid(node) + ref + \
        bytes([104, 2]) + atom("is_auth") + atom(node)


def plain(ctl, payload=b""):
    return bytes([PASS]) + ctl + payload


def deep_list(depth):
    return bytes([VERSION]) + bytes([108, 0, 0, 0, 1]) * depth + bytes([106]) + bytes([106]) * depth


def deep_tuple(depth):
    return bytes([104, 1]) * depth + bytes([106])


files = {
    "answer-is_auth.bin": plain(reg_send("net_kernel"), is_auth()),
    "ignore-deep_list_10000.bin": plain(reg_send("net_kernel"), deep_list(10000)),
    "ignore-deep_tuple_control_10000.bin": plain(bytes([VERSION]) + deep_tuple(10000)),
    "ignore-other_name.bin": plain(reg_send("someone_else"), is_auth()),
    "ignore-first_fragment.bin": bytes([VERSION, 69]) + bytes(16) + bytes([0]),
    "ignore-later_fragment.bin": bytes([VERSION, 70]) + bytes(16) + b"anything",
    "close-list_ffffffff.bin": plain(reg_send("net_kernel"), bytes([VERSION, 108, 255, 255, 255, 255, 106])),
    "close-large_tuple_ffffffff.bin": plain(reg_send("net_kernel"), bytes([VERSION, 105, 255, 255, 255, 255])),
    "close-map_ffffffff.bin": plain(reg_send("net_kernel"), bytes([VERSION, 116, 255, 255, 255, 255])),
    "close-binary_ffffffff.bin": plain(reg_send("net_kernel"), bytes([VERSION, 109, 255, 255, 255, 255, 1])),
    "close-control_list_ffffffff.bin": plain(bytes([VERSION, 108, 255, 255, 255, 255])),
    "close-truncated_control.bin": plain(reg_send("net_kernel")[:-3]),
    "close-trailing_bytes.bin": plain(reg_send("net_kernel"), is_auth() + b"\x61"),
    "close-three_terms.bin": plain(reg_send("net_kernel"), is_auth() + bytes([VERSION, 106])),
    "close-compressed_payload.bin": plain(reg_send("net_kernel"), bytes([VERSION, 80, 0, 0, 0, 9, 120, 156])),
    "close-undeclared_cache_ref.bin": bytes([VERSION, 68, 0, 82, 0]),
    "close-truncated_cache_header.bin": bytes([VERSION, 68, 3, 0]),
    "close-truncated_first_fragment.bin": bytes([VERSION, 69, 1, 2, 3]),
    # One 60 KB atom declared, then referred to 4,096 times: 245 MB if expanded.
    "close-cache_expansion_bomb.bin": bytes([VERSION, 68, 1, 0x18, 0]) + struct.pack(">H", 60000) +
        b"a" * 60000 + bytes([108, 0, 0, 16, 0]) + bytes([82, 0]) * 4096 + bytes([106]),
    "close-unknown_kind.bin": bytes([7, 7, 7]),
    "close-version_only.bin": bytes([VERSION]),
    "close-empty_pass_through.bin": bytes([PASS]),
}

for name, body in files.items():
    with open(name, "wb") as f:
        f.write(body)
