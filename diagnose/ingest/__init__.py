"""ingest: open the user's inputs (files, folders of per-rank logs, .gz, stdin) as mmap-backed Sources."""

from diagnose.ingest.discover import InputEntry, expand_inputs, natural_key
from diagnose.ingest.gzip_bounded import GzipLimits
from diagnose.ingest.sources import Source, open_inputs

__all__ = ["Source", "open_inputs", "GzipLimits", "InputEntry", "expand_inputs", "natural_key"]
