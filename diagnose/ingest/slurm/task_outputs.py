"""Per-task and per-node output files of srun steps (``srun -o logs/%j-%t.out``, ``-o %x-%N-%j.log``).

A pattern is expanded for every task (``%t``, the task's rank in the step) or node (``%n``/``%N``) of the step
when the step's task count and node list are known; otherwise, or when that finds nothing, the pattern becomes a
glob (``logs/1234-*.out``) and the rank is read back from each name with a regular expression built from the same
pattern. Only ``os.stat``/``glob`` are used: nothing is opened here.

Thousands of ranks mean thousands of files; at most ``cap`` are handed to the analysis: rank 0 first (the one that
prints the configuration), then the largest (a rank that failed wrote a traceback), and the report says so.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

from diagnose.ingest.slurm.output_path import PatternFields, render_pattern, resolve, uses
from diagnose.ingest.slurm.srun_script import SrunCall, file_pattern
from diagnose.model import SlurmTaskFacts

DEFAULT_MAX_TASK_FILES = 128
MAX_EXPANDED = 100_000  # tasks or nodes enumerated per pattern


@dataclass(slots=True)
class StepShape:
    """What the step's files depend on: its id, how many tasks it ran, on which nodes."""

    step_id: str | None  # "0"; None when the srun call could not be tied to a step
    ntasks: int | None = None
    nodes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class TaskFile(SlurmTaskFacts):
    """A file as the report lists it (path, stream, step, rank: %t of the name, node, size), and the pattern."""

    pattern: str = ""


@dataclass(slots=True)
class TaskOutputs:
    files: list[TaskFile] = field(default_factory=list)  # what the analysis reads (after the cap)
    found: int = 0  # files found before the cap
    notes: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)  # "logs/%j-%t.out (step 0, 2 tasks)"


# ------------------------------------------------------------------------------------------ patterns


def expand_for(pattern: str, f: PatternFields, step: str | None, task: int | None = None, node_index: int | None = None,
               node: str | None = None) -> str:
    """The file name for one task/node (what it cannot know stays as ``%t``/``%N``...)."""
    return render_pattern(pattern, f, step, {"t": task, "n": node_index, "N": node})


def as_glob(pattern: str, f: PatternFields, step: str | None) -> str:
    return render_pattern(pattern, f, step, {}, glob.escape, lambda c: "*")


def as_regex(pattern: str, f: PatternFields, step: str | None) -> re.Pattern[str]:
    """A regex for the pattern's names; the group ``t`` captures the task id (the rank), ``N`` the node."""
    seen: set[str] = set()

    def unknown(letter: str) -> str:
        if letter in "tN":
            if letter in seen:  # a repeat may be padded otherwise (%t-%2t: "0-00"): no backreference
                return r"\d+" if letter == "t" else r"[^/]+"
            seen.add(letter)
            return r"(?P<t>\d+)" if letter == "t" else r"(?P<N>[^/]+)"
        return r"\d+" if letter == "n" else r"[^/]+"

    return re.compile(render_pattern(pattern, f, step, {}, re.escape, unknown))


# ------------------------------------------------------------------------------------------- finding


def _size(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size if os.path.isfile(path) else None


Candidate = tuple[str, int | None, str | None]  # (path, rank, node)


def _candidates(pattern: str, f: PatternFields, shape: StepShape) -> tuple[list[Candidate], int | None]:
    """(path, rank, node) for every task or node the step had, and how many were expected; ([], None) when the
    step's shape does not say (the caller then globs)."""
    letters = uses(pattern)
    if "t" in letters and not letters & {"n", "N"}:
        if shape.ntasks is None:
            return [], None
        n = min(shape.ntasks, MAX_EXPANDED)
        return [(expand_for(pattern, f, shape.step_id, task=t), t, None) for t in range(n)], n
    if letters & {"n", "N"} and "t" not in letters:
        if not shape.nodes:
            return [], None
        nodes = shape.nodes[:MAX_EXPANDED]
        paths = [expand_for(pattern, f, shape.step_id, node_index=i, node=h) for i, h in enumerate(nodes)]
        return [(p, None, h) for p, h in zip(paths, nodes)], len(nodes)
    if not letters & {"t", "n", "N"}:
        return [(expand_for(pattern, f, shape.step_id), None, None)], 1
    return [], None  # %t together with %N: which task ran on which node depends on the distribution


def _globbed(pattern: str, f: PatternFields, shape: StepShape, base: str) -> list[Candidate]:
    # the working directory is taken as it is (a "%" or "[" in it is not a pattern): only the pattern is expanded
    prefix = "" if pattern.startswith("/") or not base else base.rstrip("/") + "/"
    regex = re.compile(re.escape(prefix) + as_regex(pattern, f, shape.step_id).pattern)
    found = []
    for path in glob.iglob(glob.escape(prefix) + as_glob(pattern, f, shape.step_id)):
        m = regex.fullmatch(path)
        if m is None:
            continue
        rank = int(m.group("t")) if "t" in regex.groupindex else None
        found.append((path, rank, m.group("N") if "N" in regex.groupindex else None))
        if len(found) >= MAX_EXPANDED:
            break
    return found


def find_files(pattern: str, stream: str, f: PatternFields, shape: StepShape, base: str) -> tuple[list[TaskFile], str]:
    """The files one pattern wrote for one step, and a note when some (or all) are missing ("" otherwise)."""
    expected_paths, expected = _candidates(pattern, f, shape)
    files: list[TaskFile] = []
    missing: list[str] = []
    for rel, rank, node in expected_paths:
        path = resolve(rel, base)
        size = _size(path)
        if size is None:
            missing.append(str(rank) if rank is not None else node or path)
        else:
            files.append(TaskFile(path, stream, shape.step_id, rank, node, size, pattern))
    if not files:  # task count unknown, or the expansion found nothing (a wrong count, a cd in the script): glob
        files = [TaskFile(p, stream, shape.step_id, r, n, s, pattern)
                 for p, r, n in _globbed(pattern, f, shape, base) if (s := _size(p)) is not None]
        files.sort(key=lambda t: (t.rank if t.rank is not None else -1, t.path))
    what = f"step {shape.step_id}" if shape.step_id is not None else "an srun step"
    if not files:
        shown = resolve(expand_for(pattern, f, shape.step_id), base)
        return [], f"no {stream} file of {what} matches {shown} (deleted, not written, or written elsewhere)"
    if missing and expected:
        kind = "tasks" if "t" in uses(pattern) else "nodes"
        lost = f"{kind} {_short(missing)}"
        return files, f"{len(missing)} of {expected} {stream} files of {what} ({pattern}) are missing: {lost}"
    return files, ""


def _short(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# -------------------------------------------------------------------------------------------- whole job


def shapes_for(call_index: int, call: SrunCall, script_calls: int, steps: list[StepShape], default: StepShape,
               pattern: str) -> list[StepShape]:
    """Which step(s) an srun call of the script ran as.

    The k-th srun of a script is step k when the script has as many srun calls as the job has numbered steps (no
    loop, no srun that failed to start). Otherwise a pattern with ``%s`` is tried for every step, and one without
    is expanded with the call's own ``-n`` or the job's task count (then globbed if that finds nothing).
    """
    if steps and script_calls == len(steps):
        return [steps[call_index]]
    if steps and uses(pattern) & {"s", "J"}:
        return steps
    ntasks = call.ntasks
    if ntasks is None:
        counts = {s.ntasks for s in steps if s.ntasks is not None}
        ntasks = counts.pop() if len(counts) == 1 else default.ntasks
    return [StepShape(None, ntasks, default.nodes)]


def collect(calls: list[SrunCall], steps: list[StepShape], f: PatternFields, work_dir: str, default: StepShape,
            cap: int = DEFAULT_MAX_TASK_FILES, exclude: set[str] | None = None) -> TaskOutputs:
    """Every per-task/per-node file the job's srun calls wrote, capped, with notes for what is missing."""
    result = TaskOutputs()
    excluded = set(exclude or ())
    found: dict[str, TaskFile] = {}
    for index, call in enumerate(calls):
        if call.unresolved:
            names = ", ".join(call.unresolved)
            result.notes.append(f"srun at line {call.line} writes to a name that depends on {names}: not looked up")
        base = resolve(call.chdir, work_dir) if call.chdir else work_dir
        out, err = file_pattern(call.output), file_pattern(call.error)
        streams = [(out, "stdout+stderr" if not err or err == out else "stdout")] if out else []
        if err and err != out:
            streams.append((err, "stderr"))
        for pattern, stream in streams:
            for shape in shapes_for(index, call, len(calls), steps, default, pattern):
                files, note = find_files(pattern, stream, f, shape, base)
                if note:
                    result.notes.append(note)
                label = f"step {shape.step_id}" if shape.step_id is not None else "srun"
                count = f", {shape.ntasks} task{'' if shape.ntasks == 1 else 's'}" if shape.ntasks is not None else ""
                result.patterns.append(f"{pattern} ({label}{count})")
                for tf in files:
                    if tf.path not in excluded:
                        found[tf.path] = tf  # a later step writing the same name overwrote the earlier one
    result.found = len(found)
    result.files = _capped(list(found.values()), cap)
    return result


def summary(outputs: TaskOutputs, route: str, cap: int) -> str:
    """One line for the report's notes: how many per-task files were read, from which patterns, and the cap."""
    count = str(len(outputs.files))
    if outputs.found > len(outputs.files):
        count += f" of {outputs.found}"
    line = f"read {count} per-task output file(s) of srun -o {'; '.join(outputs.patterns)} [found via {route}]"
    if outputs.found > len(outputs.files):
        line += f"; at most {cap} are read: rank 0 and the largest (a failing rank usually wrote the most)"
    return line


def _capped(files: list[TaskFile], cap: int) -> list[TaskFile]:
    """At most ``cap`` files: the lowest rank first, then the largest; returned in rank order."""
    if len(files) <= cap:
        return files
    ordered = sorted(files, key=lambda t: (t.rank if t.rank is not None else 1 << 40, t.path))
    keep = ordered[:1] + sorted(ordered[1:], key=lambda t: -t.size)[: max(cap - 1, 0)]
    kept = {id(t) for t in keep}
    return [t for t in ordered if id(t) in kept]
