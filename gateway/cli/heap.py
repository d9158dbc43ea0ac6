"""The garbage collector of a gateway process, tuned for a server's heap.

CPython's collector runs a full collection each time the objects that survived earlier ones grow
by a quarter. A storm of joins grows the heap steadily (some 200 tracked objects a connected
device), so the default thresholds ran a full collection every second or so, each longer than
the last: at 2,000 devices they took 2 to 4 of the gateway's 4 CPU seconds, and found nothing
to free. Once the gateway listens, ``settle()`` moves what start-up made (modules, the SDK's
models, routes) out of every collection for good, and lets collections come less often: one
every 10,000 new objects rather than 700, a full one at most every million. Cyclic garbage
still goes, a little later; bench/fleet.py measures RSS with these settings.
"""

from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "settle"]

THRESHOLDS = (10_000, 10, 10)  # gc.set_threshold(): young objects, then collections of each age


def settle() -> None:
    """Freeze the heap start-up made, and collect less often from now on."""
    gc.collect()  # what start-up left as garbage is not worth freezing
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
