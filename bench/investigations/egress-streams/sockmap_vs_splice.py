"""CPU per MiB moved upstream -> middle -> client over loopback TCP, three ways, alternating:
direct (no middle); a middle splicing in user space (splice(2) through a 1 MiB pipe, as the
gateway's proxy does); and a BPF sockmap whose SK_SKB stream verdict program redirects every
skb the middle's upstream socket receives to the egress of its client-facing socket, in the
kernel (no user-space middle at all). Needs root (CAP_BPF, CAP_NET_ADMIN).

The CPU of each run: this process (every thread: sender, receiver, splicer) from getrusage,
plus every kworker and ksoftirqd thread (/proc: a sockmap redirect to egress is sent from its
psock's work item, on a kworker), plus the host's softirq time (/proc/stat), which on a shared
host includes others' too.

    python bench/investigations/egress-streams/sockmap_vs_splice.py [MIB] [ROUNDS]
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

_LIBC = ctypes.CDLL(None, use_errno=True)
_SYS_BPF = 321  # x86_64
_MAP_CREATE, _MAP_UPDATE_ELEM, _PROG_LOAD, _PROG_ATTACH = 0, 2, 5, 8
_SOCKMAP, _SK_SKB, _STREAM_VERDICT = 15, 14, 5
_SK_REDIRECT_MAP = 52  # bpf_sk_redirect_map
_TICK = os.sysconf("SC_CLK_TCK")
_CHUNK = bytes(1 << 20)


def _bpf(command: int, attr: bytes) -> int:
    buffer = ctypes.create_string_buffer(attr, 128)
    result = int(_LIBC.syscall(_SYS_BPF, command, buffer, 128))
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def _sockmap() -> int:
    return _bpf(_MAP_CREATE, struct.pack("5I", _SOCKMAP, 4, 4, 2, 0))


def _put(map_fd: int, key: int, sock: socket.socket) -> None:
    k, v = ctypes.c_uint32(key), ctypes.c_uint32(sock.fileno())
    _bpf(_MAP_UPDATE_ELEM, struct.pack("IIQQQ", map_fd, 0, ctypes.addressof(k), ctypes.addressof(v), 0))


def _insn(code: int, dst: int = 0, src: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, 0, imm)


def _redirect_to(target_map: int) -> int:
    """An SK_SKB program: every skb to the egress of the socket at key 0 of `target_map`."""
    program = b"".join(
        [
            _insn(0x18, dst=2, src=1, imm=target_map),  # r2 = the map (ld_imm64, a map's fd)
            _insn(0),
            _insn(0xB7, dst=3),  # r3 = key 0
            _insn(0xB7, dst=4),  # r4 = flags 0: the target's egress
            _insn(0x85, imm=_SK_REDIRECT_MAP),
            _insn(0x95),  # exit with the verdict
        ]
    )
    code, license_ = ctypes.create_string_buffer(program, len(program)), ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("IIQQ", _SK_SKB, len(program) // 8, ctypes.addressof(code), ctypes.addressof(license_))
    return _bpf(_PROG_LOAD, attr)


def _kernel_threads() -> float:
    total = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm, rest = (entry / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            if comm.split("(", 1)[1].startswith(("kworker", "ksoftirqd")):
                fields = rest.split()
                total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _softirq() -> float:
    return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[7]) / _TICK


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    made = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return made, accepted


def _splicer(source: socket.socket, target: socket.socket, size: int) -> Callable[[], None]:
    def run() -> None:
        read, write = os.pipe()
        fcntl.fcntl(write, 1031, 1 << 20)  # F_SETPIPE_SZ, as the proxy's
        moved = 0
        while moved < size and (held := os.splice(source.fileno(), write, 1 << 20, flags=os.SPLICE_F_MOVE)):
            while held:
                step = os.splice(read, target.fileno(), held, flags=os.SPLICE_F_MOVE)
                held, moved = held - step, moved + step
        os.close(read)
        os.close(write)

    return run


def run(kind: str, size: int) -> dict[str, float]:
    """One transfer of `size` bytes: its wall time and CPU seconds by where they were spent."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[int] = []
    if kind == "direct":
        client, upstream = _pair(listener)
        ends = [client, upstream]
        workers: list[Callable[[], None]] = []
    else:
        client, inside = _pair(listener)
        outside, upstream = _pair(listener)
        ends = [client, inside, outside, upstream]
        workers = [_splicer(outside, inside, size)] if kind == "splice" else []
        if kind == "sockmap":
            source, target = _sockmap(), _sockmap()
            program = _redirect_to(target)
            _bpf(_PROG_ATTACH, struct.pack("4I", source, program, _STREAM_VERDICT, 0))
            _put(target, 0, inside)
            _put(source, 0, outside)
            held = [source, target, program]
    got = 0

    def receive() -> None:
        nonlocal got
        buffer = bytearray(1 << 20)
        while got < size and (step := client.recv_into(buffer)):
            got += step

    def send() -> None:
        for start in range(0, size, len(_CHUNK)):
            upstream.sendall(_CHUNK[: size - start])

    before, threads, softirq = resource.getrusage(resource.RUSAGE_SELF), _kernel_threads(), _softirq()
    start = time.perf_counter()
    running = [threading.Thread(target=work) for work in (receive, send, *workers)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    spent = {"kthreads": _kernel_threads() - threads, "softirq_all": _softirq() - softirq}
    for end in (*ends, listener):
        end.close()
    for fd in held:
        os.close(fd)
    assert got == size, (kind, got)
    process = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"wall": wall, "process": process, **spent}


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in ("direct", "splice", "sockmap")}
    for number in range(rounds + 1):  # the first round warms up
        for kind in list(results) if number % 2 == 0 else list(results)[::-1]:
            measured = run(kind, mib << 20)
            if number:
                results[kind].append(measured)
    print(f"{mib} MiB a run, {rounds} rounds alternating, load {os.getloadavg()[0]:.1f}; medians, CPU ms per MiB:")
    for kind, rows in results.items():
        median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        print(
            f"  {kind:8s} process {1000 * median['process'] / mib:.3f}  kworker+ksoftirqd "
            f"{1000 * median['kthreads'] / mib:.3f}  softirq (host-wide) {1000 * median['softirq_all'] / mib:.3f}  "
            f"MiB/s {mib / median['wall']:.0f}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
