"""Which TCP sockets a process tree listens on, read from /proc (Linux; no psutil needed).

A listening socket is a row of ``/proc/net/tcp{,6}`` in state LISTEN (0A); its inode names the
process that holds it through ``/proc/PID/fd/* -> socket:[INODE]``.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

__all__ = ["process_tree", "listening", "is_loopback", "describe"]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return int(stat.rsplit(")", 1)[1].split()[1])


def process_tree(root: int) -> set[int]:
    """``root`` and all its living descendants."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        ppid = _ppid(int(d.name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(d.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


def _addr(hex_addr: str, v6: bool) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # /proc prints the address as 32-bit words in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw if v6 else raw[:4])), int(port, 16)


def _listen_inodes() -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":  # TCP_LISTEN
                out[int(f[9])] = _addr(f[1], v6)
    return out


def listening(pids: set[int]) -> list[tuple[int, str, str, int]]:
    """``(pid, command name, host, port)`` of every TCP socket the ``pids`` listen on."""
    inodes = _listen_inodes()
    found = []
    for pid in sorted(pids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    found.append((pid, comm, *inodes[inode]))
    return sorted(set(found))


def is_loopback(host: str) -> bool:
    ip = ipaddress.ip_address(host)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def describe(rows: list[tuple[int, str, str, int]]) -> str:
    return "\n".join(f"{pid:>7} {comm:<24} {host}:{port}" for pid, comm, host, port in rows)
