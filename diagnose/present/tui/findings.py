"""The findings list on the left: root cause first, then other errors, warnings, cascade and context, grouped.

``finding_order`` is pure (tested without Textual); ``FindingsList`` is the OptionList that shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from diagnose.model import Finding, Report
from diagnose.present.safe import inert
from diagnose.present.tui.fmt import rank_phrase

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
ROLE_ICON = {"root": "●", "cascade": "↳", "context": "·"}


@dataclass(frozen=True)
class Section:
    title: str
    indices: tuple[int, ...]


def finding_order(report: Report) -> list[Section]:
    """Sections of finding indices in the order they are listed: root cause, then the rest by weight."""
    root = report.root_cause
    titles = {"error": "Other errors", "warning": "Warnings", "context": "Context",
              "cascade": "Consequences of the root cause" if root is not None else "Cascade"}
    groups: dict[str, list[int]] = {"error": [], "warning": [], "cascade": [], "context": []}
    for i, f in enumerate(report.findings):
        if i == root:
            continue
        if f.role in ("cascade", "context"):
            groups[f.role].append(i)
        else:
            groups["context" if f.severity == "info" else "error" if f.severity == "error" else "warning"].append(i)

    def by_time(i: int) -> tuple:
        f = report.findings[i]
        return (SEVERITY_ORDER.get(f.severity, 3), f.first_line, i)

    sections = [Section("Root cause", (root,))] if root is not None and 0 <= root < len(report.findings) else []
    return sections + [Section(titles[k], tuple(sorted(v, key=by_time))) for k, v in groups.items() if v]


def finding_label(finding: Finding, is_root: bool) -> Text:
    """Two lines: icon, code and title; then who saw it (ranks, hosts, count) and the phase."""
    style = SEVERITY_STYLE.get(finding.severity, "")
    if finding.role == "cascade":
        style = "dim " + style
    icon = "★" if is_root else ROLE_ICON.get(finding.role, "·")
    label = Text(no_wrap=False)
    label.append(f"{icon} ", style)
    label.append(inert(finding.rule), style)
    label.append(" ")
    label.append(inert(finding.title), "bold" if is_root else "")
    who = rank_phrase(finding.ranks, [inert(h) for h in finding.hosts], finding.count)
    detail = " · ".join(p for p in (who, finding.phase if finding.phase != "unknown" else "") if p)
    if detail:
        label.append("\n  ")
        label.append(detail, "dim")
    return label


class FindingsList(OptionList):
    """Options are findings (id = their index in the report); section titles are disabled options."""

    DEFAULT_CSS = """
    FindingsList { height: 1fr; }
    """

    async def _on_click(self, event: events.Click) -> None:
        """A click shows the finding; a double click (like enter) opens its evidence in the log."""
        event.prevent_default()  # OptionList's own handler would select (open the log) on every click
        clicked: int | None = event.style.meta.get("option")
        if clicked is None or self.get_option_at_index(clicked).disabled:
            return
        self.highlighted = clicked
        if event.chain >= 2:
            self.action_select()

    def show_report(self, report: Report) -> None:
        self.clear_options()
        options: list[Option | None] = []
        for section in finding_order(report):
            if options:
                options.append(None)
            options.append(Option(Text(section.title.upper(), style="bold dim"), disabled=True))
            options.extend(Option(finding_label(report.findings[i], i == report.root_cause), id=f"finding-{i}")
                           for i in section.indices)
        if not report.findings:
            options.append(Option(Text("No failure found in this log.", style="green"), disabled=True))
        self.add_options(options)
        self.select_first_finding()

    def select_first_finding(self) -> None:
        for position in range(self.option_count):
            if not self.get_option_at_index(position).disabled:
                self.highlighted = position
                return

    def finding_index(self, position: int | None) -> int | None:
        if position is None:
            return None
        option_id = self.get_option_at_index(position).id
        return int(option_id.split("-", 1)[1]) if option_id else None

    @property
    def selected_finding(self) -> int | None:
        return self.finding_index(self.highlighted)
