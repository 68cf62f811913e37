"""The hang section shared by the text, markdown and TUI presenters: sentences and the ranks x collectives grid.

Returns plain strings (paths, ops and frames come from the dumps: every caller makes them inert before showing).
"""

from __future__ import annotations

from diagnose.model import HangReport, rank_runs

SYMBOLS = {"completed": ".", "waiting": "W", "absent": "-", "desync": "D", "size_mismatch": "S", "no_dump": "X"}
LEGEND = ". completed  W entered, waiting  - never entered  D another op  S other sizes  X no dump"
MAX_TEXT_ROWS = 64

_ROLE = {"stalled": "stalled", "desync": "desync", "size_mismatch": "size mismatch", "no_dump": "no dump"}


def hang_lines(hang: HangReport) -> list[str]:
    """What the dumps say, a line each: the summary, the named ranks with their last collective and frame."""
    out = [hang.summary]
    for c in hang.culprits:
        if c.role == "no_dump":
            continue
        line = f"rank {c.rank} ({_ROLE.get(c.role, c.role)}): {c.last_op or '-'} #{c.last_seq} {c.last_sizes}"
        if c.frame:
            line += f" at {c.frame}"
        out.append(line)
    if hang.missing_dumps:
        out.append(f"no dump from rank(s) {', '.join(rank_runs(hang.missing_dumps))}")
    versions = sorted({d.version for d in hang.dumps})
    formats = sorted({d.format for d in hang.dumps})
    out.append(f"{len(hang.dumps)} dump(s) read ({', '.join(formats)}; format {', '.join(versions)})"
               + (f"; world size {hang.world_size}" if hang.world_size else ""))
    return out


def grid_rows(hang: HangReport, max_rows: int = MAX_TEXT_ROWS) -> list[str]:
    """The grid as text: a header of sequence numbers, one row per rank (named ranks always shown, marked ``<``),
    then which op each sequence number is."""
    if not hang.grid:
        return []
    ranks = [cell.rank for cell in hang.grid[0].cells]
    named = {c.rank for c in hang.culprits} | set(hang.missing_dumps)
    shown = [r for r in ranks if r in named]
    shown += [r for r in ranks if r not in named][: max(0, max_rows - len(shown))]
    shown.sort()
    heads = [f"#{col.seq}" for col in hang.grid]
    width = max(3, *(len(h) for h in heads))
    label = max(len(f"rank {r}") for r in shown) if shown else 6
    rows = [(" " * (label + 2) + "  ".join(h.ljust(width) for h in heads)).rstrip()]
    states = [{cell.rank: cell.state for cell in col.cells} for col in hang.grid]
    for r in shown:
        marks = "  ".join(SYMBOLS.get(s.get(r, ""), "?").ljust(width) for s in states)
        flag = "  <" if r in named else ""
        rows.append(f"{f'rank {r}'.ljust(label)}  {marks}".rstrip() + flag)
    if len(shown) < len(ranks):
        rows.append(f"... {len(ranks) - len(shown)} more rank(s) not shown")
    group = f"group {hang.grid[0].group} ({hang.grid[0].group_desc})" if hang.grid[0].group_desc else \
        f"group {hang.grid[0].group}"
    rows.append(f"{group}: " + ", ".join(f"#{col.seq} {col.op}" for col in hang.grid))
    rows.append(LEGEND)
    return rows
