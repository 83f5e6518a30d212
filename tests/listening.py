"""Listening TCP sockets of a process tree, read from /proc (Linux; no psutil needed)."""

from __future__ import annotations

import os
import socket
import struct


def _tree(root: int) -> set[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = {root}, [root]
    while todo:
        p = todo.pop()
        for c, pp in parent.items():
            if pp == p and c not in out:
                out.add(c)
                todo.append(c)
    return out


def _inodes(pids: set[int]) -> dict[str, int]:
    found: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    found[link[8:-1]] = pid
        except OSError:
            pass
    return found


def _addr(hexaddr: str, v6: bool) -> tuple[str, int]:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if v6:
        raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0])
                       for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)
    return socket.inet_ntoa(struct.pack("<I", int(ip, 16))), int(port, 16)


def listening_sockets(root_pid: int) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket in LISTEN state owned by ``root_pid``'s tree."""
    inodes = _inodes(_tree(root_pid))
    out = []
    for name, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                host, port = _addr(f[1], v6)
                out.append((host, port, inodes[f[9]]))
    return out
