"""PyTorch flight-recorder dumps (per-rank collective traces written on a watchdog timeout), read without running
code: ``find_dumps`` separates them from the logs the user named, ``read_dumps`` loads and normalises them."""

from diagnose.ingest.flight_recorder.discover import DumpFile, find_dumps
from diagnose.ingest.flight_recorder.read import read_dump, read_dumps

__all__ = ["DumpFile", "find_dumps", "read_dump", "read_dumps"]
