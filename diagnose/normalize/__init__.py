"""normalize: pure functions from raw bytes/lines to structure (LogLine, tracebacks, facts, phases).

No I/O, and nothing here raises on any input (fuzzed with Hypothesis in tests/test_normalize_*.py).
"""

from diagnose.normalize.lines import collapse_carriage_returns, decode, normalize_line, strip_ansi

__all__ = ["decode", "normalize_line", "strip_ansi", "collapse_carriage_returns"]
