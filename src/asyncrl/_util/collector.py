"""How a run uses Python's cyclic garbage collector.

Refcounting frees almost everything a run drops; the collector only finds
cycles (a cancelled task and its exception, a frame and its locals). What makes
it costly is its full pass, which traverses every tracked object alive: in a
run that is the imported libraries (torch and transformers alone hold hundreds
of thousands of objects), the config and the model, besides the run's own
buffer and ledger. Nothing imported before a run becomes cyclic garbage during
it, so the controller moves that heap out of the collector's way for the run.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: The young generation's threshold while a run is on (Python's default: 700
#: allocations). The controller allocates a handful of objects per group event
#: (tasks, futures, handles) that refcounting frees within a few callbacks; a
#: pass every 700 allocations traverses all those still alive at that moment
#: and promotes them, so the older passes traverse them again. At 10,000 most
#: are gone before a pass sees them: the controller's loop at capacity 10^4
#: executes 6% fewer instructions per step (benchmarks/bench_instructions.py;
#: 7,000 and 20,000 measure the same). The young cycles a real run makes (a
#: cancelled task and its exception, which may reference tensors) still go at
#: the first pass after them: within 10,000 allocations, a few milliseconds of
#: a training step.
RUN_YOUNG_THRESHOLD = 10_000


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While the block runs, the collector skips every object alive at its start,
    and passes over the young generation less often (:data:`RUN_YOUNG_THRESHOLD`).

    ``gc.freeze`` moves them to the permanent generation (no copy, no pass: a
    list splice); ``gc.unfreeze`` at the end gives them back to the oldest
    generation, so any of them that became garbage is collected then. Nested
    use is harmless: an inner exit unfreezes early, which only costs speed.

    No collection runs first: it would cost a full pass per run (~140 ms with
    torch and transformers loaded; the planner simulates many runs per re-plan).
    So cyclic garbage a previous run in the same process left (its controller,
    the trainer it holds) stays until this run ends. Without the freeze it would
    wait for the next full pass, which a large heap makes rare too; a process
    that runs several trainings in a row calls ``gc.collect()`` between them to
    give such memory back at once.

    The thresholds in force before the block come back when it ends, the
    older generations' untouched throughout.
    """
    gc.freeze()
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], RUN_YOUNG_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


@contextlib.contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Collect cyclic garbage less often while simulating.

    A simulated run allocates millions of short-lived objects (futures,
    handles, tasks) while its ledger grows to one record per group; with the
    default thresholds the collector runs about a thousand times per 1,000
    steps and takes ~8% of the CPU time. Larger thresholds cut that to a
    handful of passes; the young cycles (cancelled tasks) are still collected.
    (Only the simulator: a real run's young cycles may hold tensors.)
    """
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 50_000), max(old[1], 20), max(old[2], 50))
    try:
        yield
    finally:
        gc.set_threshold(*old)
