#!/usr/bin/env python3
"""One replay's memory over time (not a test: prints VmRSS / VmHWM as it goes).

Why beside ``bench/memory.py``: that bench prints the peak after each phase, which says
*how much* a 24-hour day holds but not *when* the peak is set. This replays one trace in
this process on the README's deployment (Llama-3.1-70B, TP8 on MI355X) and prints, after
the imports, after building the stream (``TraceArrivals``) and every ``--every`` seconds
during the replay: the resident set and its high-water mark (MiB), glibc's heap
(``mallinfo2``: arena in use / free, mmapped), and the stream's state: the hash-id space
(``ids``), renumberings so far, the hash chunks held, the hash map's entries, and the
bytes of the prefix cache's arrays (``pool_mb``). A jump of VmHWM between two lines with
VmRSS flat is a transient; lining it up with ``ids`` / ``renum`` / ``pool_mb`` names it
(docs/performance.md, third memory round: the 24-hour peak at the id space's second
renumbering).

Usage:  PYTHONPATH=CHECKOUT .venv/bin/python bench/memory_timeline.py TRACE [--every 30]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import time
from typing import Any


def _status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _line(label: str, **extra: Any) -> None:
    s = _status()
    fields = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"{time.strftime('%H:%M:%S')} {label:<14} VmRSS {s['VmRSS']:7.1f} "
          f"VmHWM {s['VmHWM']:7.1f}  {fields}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    args = ap.parse_args()
    _line("start")
    from tuner import replay
    from tuner.metrics import summarize
    from tuner.perf.target import Target
    import tuner.replay._stream as stream_module

    _line("imports")
    streams: list[Any] = []
    init = stream_module.TraceArrivals.__init__

    def watched_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        streams.append(self)
        _line("stream built", requests=self.num_requests)

    stream_module.TraceArrivals.__init__ = watched_init  # type: ignore[method-assign]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    done = threading.Event()

    def sample() -> None:
        while not done.wait(args.every):
            if not streams or streams[0]._space is None:
                continue
            s = streams[0]
            pool = s._space.pool if hasattr(s._space, "pool") else s._space.spaces[0].pool
            arrays = sum(getattr(pool, n).nbytes for n in pool.__slots__
                         if hasattr(getattr(pool, n, None), "nbytes"))
            m = libc.mallinfo2()
            _line("  replay", heap_used=m.uordblks >> 20, heap_free=m.fordblks >> 20,
                  mmapped=m.hblkhd >> 20, ids=s._space.size, renum=s.num_renumberings,
                  chunks=sorted(s._chunks), map=len(s._map.keys), pool_mb=arrays >> 20)

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    result = replay.run(args.trace, target=Target(hardware="mi355x", model="llama-3.1-70b",
                                                  tp=8))
    done.set()
    _line("replay", wall_s=round(time.perf_counter() - t0),
          renumberings=streams[0].num_renumberings if streams else "-")
    summarize(result)
    _line("summary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
