"""The right pane: the selected finding, its evidence, its fix in four forms (tabs) and, for OOMs, memory."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import HorizontalScroll, VerticalScroll
from textual.widgets import Static, TabbedContent, TabPane

from diagnose.model import Finding, Report
from diagnose.present.safe import block_text, inert, shorten
from diagnose.present.text import category_words, skew_line
from diagnose.present.tui.findings import SEVERITY_STYLE
from diagnose.present.tui.fixrender import TAB_ORDER, RenderedFix, render_fix
from diagnose.present.tui.fmt import format_ranks, rank_phrase
from diagnose.present.tui.memoryview import memory_text

EVIDENCE_SHOWN = 12
EVIDENCE_CELLS = 300


def heading(title: str) -> Text:
    return Text(title, style="bold underline")


def header_text(report: Report, finding: Finding) -> Text:
    text = Text()
    text.append(inert(finding.title), "bold " + SEVERITY_STYLE.get(finding.severity, ""))
    text.append("\n")
    parts = [
        inert(finding.rule),
        inert(category_words(finding)),
        f"phase: {inert(finding.phase)}",
        f"{finding.severity}, {'root cause' if report.root is finding else finding.role}",
        f"confidence {finding.confidence:.0%}",
    ]
    text.append(" · ".join(parts), "dim")
    who = rank_phrase(finding.ranks, [inert(h) for h in finding.hosts], finding.count)
    if who:
        text.append("\n" + who)
    full = format_ranks(finding.ranks)
    if finding.ranks and full not in who:  # summarised above: the whole set, capped, below
        text.append("\nranks " + shorten(full, 600), "dim")
    return text


def evidence_text(finding: Finding, display: dict[str, str]) -> Text:
    text = Text()
    if not finding.evidence:
        text.append("(no evidence lines)", "dim")
        return text
    for n, ev in enumerate(finding.evidence[:EVIDENCE_SHOWN]):
        if n:
            text.append("\n")
        name = display.get(ev.path, ev.path)
        text.append(f"{inert(name)}:{ev.line}", Style(color="cyan", underline=True,
                                                       meta={"@click": f"screen.open_evidence({n})"}))
        text.append("  ")
        text.append(shorten(inert(ev.text), EVIDENCE_CELLS))
    hidden = len(finding.evidence) - EVIDENCE_SHOWN
    if hidden > 0:
        text.append(f"\n… {hidden} more", "dim")
    return text


def fix_header(finding: Finding, rendered: RenderedFix) -> Text:
    fix = finding.shown_fix
    text = Text()
    if fix.summary:
        text.append(inert(fix.summary), "bold")
        text.append(f"  [{fix.safety}]", "green" if fix.safety == "safe" else "yellow")
    elif fix.empty and not rendered.overrides:
        text.append("No fix suggested for this finding.", "dim")
    for step in rendered.steps:  # in the job's words (render.fix_words), as the text report has them
        text.append("\n• ")
        text.append(inert(step))
    return text


def verdict_text(rendered: RenderedFix) -> Text:
    style = "green" if rendered.verdict.startswith("✔") else ("red" if rendered.verdict.startswith("✘") else "dim")
    return Text(inert_multiline(rendered.verdict), style=style)


class FindingDetail(VerticalScroll):
    """Shows one finding; ``show(report, index)`` replaces the content."""

    DEFAULT_CSS = """
    FindingDetail { padding: 0 1; }
    FindingDetail > Static { margin-bottom: 1; }
    FindingDetail .section { margin-bottom: 0; }
    FindingDetail TabbedContent { height: auto; margin-bottom: 1; }
    FindingDetail TabPane { padding: 0 1; height: auto; }
    FindingDetail .fix-scroll { height: auto; scrollbar-size-horizontal: 1; }
    FindingDetail .fix-text { width: auto; min-width: 1; }
    FindingDetail #fix-verdict { margin-bottom: 1; }
    """

    def __init__(self, display: dict[str, str] | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.display_names = display or {}
        self.rendered: RenderedFix | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="finding-header")
        yield Static(heading("Explanation"), classes="section")
        yield Static(id="finding-explanation")
        yield Static(heading("Evidence") + Text("  (enter or click: open the log there)", style="dim"),
                     classes="section")
        yield Static(id="finding-evidence")
        yield Static(heading("Fix") + Text("  (c: copy the shown form)", style="dim"), classes="section")
        yield Static(id="fix-summary")
        with TabbedContent(id="fix-tabs"):
            for key, title in TAB_ORDER:
                with TabPane(title, id=f"fix-{key}"), HorizontalScroll(classes="fix-scroll"):
                    yield Static(id=f"fix-text-{key}", classes="fix-text")
        yield Static(id="fix-verdict")
        yield Static(heading("Memory"), id="memory-heading", classes="section")
        yield Static(id="memory")

    def on_mount(self) -> None:
        # the Environment tab is only for a job whose fix has no Megatron form (render.fix_style "neutral"): hidden
        # until a finding shows it
        self.query_one("#fix-tabs", TabbedContent).hide_tab("fix-env")

    def show(self, report: Report, index: int | None) -> None:
        if index is None or not 0 <= index < len(report.findings):
            self.rendered = None
            self.query_one("#finding-header", Static).update(Text("No finding selected.", style="dim"))
            for name in ("#finding-explanation", "#finding-evidence", "#fix-summary", "#fix-verdict", "#memory"):
                self.query_one(name, Static).update("")
            self.query_one("#memory-heading").display = False
            return
        finding = report.findings[index]
        self.query_one("#finding-header", Static).update(header_text(report, finding))
        explanation = reflow(finding.explanation) or "(no explanation)"
        skew = skew_line(finding)  # desynced/straggling NCCL ranks; already in the root cause's explanation
        if skew and skew.split("; ")[0].lower() not in explanation.lower():
            explanation += "\n\n" + skew[0].upper() + skew[1:] + "."
        self.query_one("#finding-explanation", Static).update(block_text(explanation))
        self.query_one("#finding-evidence", Static).update(evidence_text(finding, self.display_names))
        rendered = render_fix(report, finding)
        self.rendered = rendered
        self.query_one("#fix-summary", Static).update(fix_header(finding, rendered))
        tabs = self.query_one("#fix-tabs", TabbedContent)
        shown = rendered.tabs  # the job's forms only (render.fix_style): no Bridge tab for a DeepSpeed job
        for key, _ in TAB_ORDER:
            form = rendered.forms.get(key) or ""
            self.query_one(f"#fix-text-{key}", Static).update(
                # never wrapped: a command copied with the mouse must not get a newline (scroll sideways)
                Text(inert_multiline(form), no_wrap=True, overflow="ignore") if form
                else Text("(nothing to set)", style="dim")
            )
            (tabs.show_tab if key in shown or not shown and key == "cli" else tabs.hide_tab)(f"fix-{key}")
        tabs.display = bool(shown)
        if shown and (tabs.active or "").removeprefix("fix-") not in shown:
            tabs.active = f"fix-{shown[0]}"
        self.query_one("#fix-verdict", Static).update(verdict_text(rendered))
        memory = memory_text(report.memory, finding) if finding.category == "cuda_oom" else None
        plan_view = getattr(self.app, "plan_view", None)
        if memory is not None and callable(plan_view) and plan_view() is not None:
            memory = memory.copy() if isinstance(memory, Text) else Text(str(memory))
            memory.append("\nPress p for the memory plan of this config, with a what-if editor.", "bold cyan")
        self.query_one("#memory-heading").display = memory is not None
        self.query_one("#memory", Static).display = memory is not None
        self.query_one("#memory", Static).update(memory or "")
        self.scroll_home(animate=False)

    @property
    def active_form(self) -> tuple[str, str]:
        """(tab title, text) of the fix form shown now."""
        tabs = self.query_one("#fix-tabs", TabbedContent)
        key = (tabs.active or "fix-cli").removeprefix("fix-")
        if self.rendered is not None and key not in self.rendered.tabs:  # hidden: this job has no such form
            return dict(TAB_ORDER).get(key, key), ""
        title = dict(TAB_ORDER).get(key, key)
        return title, (self.rendered.forms.get(key, "") if self.rendered else "")


def reflow(text: str) -> str:
    """Join the hard-wrapped lines of a rule's explanation into paragraphs; keep blank lines, list items and
    indented lines as they are, so the pane's own wrapping decides the width."""
    out: list[str] = []
    for line in text.strip().splitlines():
        stripped = line.strip()
        starts_block = not stripped or line[:1] in " \t" or stripped[:2] in ("- ", "* ", "• ")
        if out and out[-1] and not starts_block:
            out[-1] = f"{out[-1]} {stripped}"
        else:
            out.append(line.rstrip() if stripped else "")
    return "\n".join(out)


def inert_multiline(text: str) -> str:
    """Inert each line of a rendered fix (values can come from a log) and keep the line breaks."""
    return "\n".join(inert(line) for line in text.split("\n"))
