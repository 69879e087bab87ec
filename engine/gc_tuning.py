"""The garbage collector's young-generation threshold, raised while an Engine runs.

CPython collects its youngest generation every time 700 more container
objects have been allocated than freed. An engine pulls requests in batches
(each with its messages, identity, job, task, HTTP reply objects), so its
live set swings by more than 700 objects many times a second: every swing
triggers a collection that finds the objects still in use, promotes them, and
now and then a full collection walks the whole heap again.
`python benchmarks/overhead_bench.py` counts them during 20,000 zero-latency
calls: about 130 young, 11 middle and 1 full collection, 2.5 us of CPU per
call (over aiohttp, before providers/http_pool.py, it was 1,008 young
collections and 45 us per call), against one once the threshold is 10,000. Objects freed by reference counting (almost
all of them) are not affected; only reference cycles wait a little longer.

The threshold is raised when the first Engine opens and put back when the
last one closes, unless something else changed it meanwhile.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000

_open_engines = 0
_saved: tuple[int, ...] | None = None  # the thresholds before the first engine raised them


def _raised(saved: tuple[int, ...]) -> tuple[int, ...]:
    return (YOUNG_THRESHOLD, *saved[1:])


def engine_opened() -> None:
    global _open_engines, _saved
    _open_engines += 1
    if _open_engines > 1:
        return
    current = gc.get_threshold()
    if current[0] == 0 or current[0] >= YOUNG_THRESHOLD:  # collection off, or already high
        _saved = None
        return
    _saved = current
    gc.set_threshold(*_raised(current))


def engine_closed() -> None:
    global _open_engines, _saved
    if _open_engines == 0:
        return
    _open_engines -= 1
    if _open_engines == 0 and _saved is not None:
        if gc.get_threshold() == _raised(_saved):  # nobody changed it while we ran
            gc.set_threshold(*_saved)
        _saved = None
