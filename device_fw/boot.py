"""Runs first at every boot; keep it small so a bad config can still be fixed over the REPL."""

import gc

gc.collect()
