"""Root-cause ranking: which finding explains the failure, which ones are its consequences.

* Candidates are error findings whose rule is role ``root``, by the rule's tier: a specific rule's finding first;
  a generic one (an exception's shape, its category inferred from the evidence) only when no specific error
  matched.
* Among candidates the earliest wins: by timestamp when both lines carry one, else by input and line.
* Except that a finding that kills ranks leads when the earliest specific finding is an NCCL error or timeout: a
  hardware fault (Xid, ECC, NIC port error, lost GPU) or a host-memory kill (the kernel's OOM killer, Slurm's cgroup,
  Ray's memory monitor) on one node explains the communication failures its peers report across the ranks. What a
  finding reports beyond its category is its rule's ``reports`` attribute (``rules.REPORTS``): a link that failed
  mid-run kills no rank, and a host-memory kill does not lead the process's own fatal signal.
* Cascade rules (NCCL timeouts, SIGTERM from the launcher, ChildFailedError, destroy_process_group not called...)
  win only when nothing else explains the failure; then the earliest cascade is the root, with lower confidence
  (unless it is a wrapper that names no category and its own message goes on to say how the worker died: that
  detail is the root, see ``_wrapper_detail``).
  A generic error that comes after the first NCCL watchdog timeout is taken as part of that cascade, unless it kills
  ranks or was raised in data loading (a rank stuck reading data never reached the collective). When only the
  timeout cascade failed, a warning that a rank's data stream stalled (a streamed dataset retrying its host) leads.
* Catch-all rules (``tier = "catchall"``: an NCCL WARN, an ``srun: error:``, a non-zero exit...) speak last, only
  when nothing above did: a failed log is never silent, and its finding says it was a catch-all. A catch-all printed
  before a line that says the program completed its work (a ``completes = true`` rule) does not speak. One
  exception: when the only cascades are exit reports (Slurm's or a launcher's: srun's ``Exited with exit code``), a
  catch-all of the program's own output printed before them leads them (a CUDA check's ``Failed: Cuda error``).
* The chosen root gets role ``root``; cascade findings get role ``cascade`` and ``cause_of`` = the root's index;
  everything else is ``context``. Findings are ordered root first, then the rest by time, then cascades.
"""

from __future__ import annotations

import functools

import regex

from diagnose.match.findings import Group
from diagnose.model import Finding
from diagnose.normalize.phases import AFTER_SETUP

CASCADE_ROOT_CONFIDENCE = 0.6  # a cascade chosen as root only because nothing else matched
CONTESTED_FACTOR = 0.9  # another distinct specific error came later: slightly less sure
# categories whose failures a rank killed by a fault on its device or node causes across its peers (see killers_first)
EXPLAINED_BY_KILLED_RANKS = frozenset({"nccl_error", "nccl_timeout"})
# causes that take a rank away, in the order they lead when both are present: a device fault, then a host-memory kill
RANK_KILLERS = ("hardware", "host_oom")
# causes that hold a rank short of its next collective without killing it (its data stream stalled or failed): its
# peers' watchdogs time out waiting for it, and the rank's own error is printed whenever its stream flushes
RANK_STALLERS = frozenset({"data"})
# A host_oom finding kills a rank when the killer reports it (kernel OOM killer 0.9, Slurm cgroup 0.95, Ray's memory
# monitor 0.85, a data loader worker killed by a signal 0.75); a bare "Cannot allocate memory" (0.7) or a generic
# error whose words say memory ran out (inferred, 0.6) can be NCCL's own registration failing, not a kill.
KILL_REPORT_CONFIDENCE = 0.75
# how many lines a wrapper's own exception message runs on after its first line (Ray's ActorDiedError: six fields,
# then the death cause): a cascade there is the wrapper's own detail (_wrapper_detail)
WRAPPER_MESSAGE_LINES = 10

_TS = regex.compile(
    r"(?:(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})|(?P<gmo>\d{2})(?P<gd>\d{2}))[ T]"
    r"(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:[.,](?P<f>\d+))?"
)


def time_of(ts: str | None) -> float | None:
    """Seconds since the start of the year (year ignored unless present) for a log timestamp, or None."""
    if not ts:
        return None
    m = _TS.search(ts)
    if m is None:
        return None
    month = int(m.group("mo") or m.group("gmo"))
    day = int(m.group("d") or m.group("gd"))
    year = int(m.group("y")) if m.group("y") else 0
    frac = float("0." + m.group("f")) if m.group("f") else 0.0
    return (
        ((year * 12 + month) * 31 + day) * 86400.0
        + int(m.group("h")) * 3600
        + int(m.group("mi")) * 60
        + int(m.group("s"))
        + frac
    )


def _compare(a: Group, b: Group) -> int:
    ha, hb = a.first_hit, b.first_hit
    ta, tb = time_of(ha.line.timestamp), time_of(hb.line.timestamp)
    # Year-less glog times against dated ones are not comparable: fall back to position.
    if ta is not None and tb is not None and (ta < 86400 * 400) == (tb < 86400 * 400) and ta != tb:
        return -1 if ta < tb else 1
    pa = (ha.source_index, ha.line.lineno)
    pb = (hb.source_index, hb.line.lineno)
    return (pa > pb) - (pa < pb)


by_time = functools.cmp_to_key(_compare)


def _tier(g: Group) -> str:
    return g.first_hit.rule.rule.tier


def _kills_ranks(g: Group, category: str) -> bool:
    f = g.finding
    if f.category != category or g.first_hit.rule.rule.reports == "link_failure":
        # no device fault on a rank: an NCCL error printed before it still explains it (rules.REPORTS)
        return False
    return category != "host_oom" or (f.basis != "inferred" and f.confidence >= KILL_REPORT_CONFIDENCE)


def killers_first(specific: list[Group], candidates: list[Group]) -> list[Group]:
    """A cause that kills ranks explains the communication failures it causes, wherever its line is.

    An Xid, an ECC error, a NIC port error or a lost GPU makes NCCL fail on every rank that talks to that device; a
    rank the kernel's OOM killer, Slurm's cgroup or Ray's memory monitor killed never joins its next collective, and
    its peers' watchdogs time out. The NCCL error is often printed first (the kernel log, dmesg or nvidia-smi output
    comes after the training log, or the peer ranks notice before the faulty one reports), and a timeout printed
    minutes after the kill is no less its consequence. So when the earliest specific finding is a communication error
    and a rank killer exists among the root candidates (a specific one, or a generic symptom such as nvidia-smi no
    longer reaching the GPU), the earliest killer leads, hardware before host memory; the order is kept otherwise.

    A CUDA call's error that names no cause (a ``device_symptom`` rule: ``CUDA error: unknown error``) is explained
    the same way by a device fault of the log (nvidia-smi no longer reaching a GPU, an Xid): that fault leads it,
    whatever its tier and wherever its line is, since the generic CUDA error is the fault as one rank's call saw it.
    """
    reports = specific[0].first_hit.rule.rule.reports if specific else ""
    symptom = reports == "device_symptom"  # a CUDA error that names no cause: a device fault explains it
    if not specific or not (specific[0].finding.category in EXPLAINED_BY_KILLED_RANKS or symptom
                            or reports == "link_failure"):
        return specific  # (a link read as failed only by when NCCL's error came: a device fault explains it too)
    # the communication finding is the process's own fatal signal: no host-memory kill leads it (rules.REPORTS)
    own_death = reports == "own_death"
    for category in RANK_KILLERS:
        if (own_death or symptom) and category == "host_oom":
            continue

        def kills(g: Group, category: str = category) -> bool:
            # a symptom is explained by a fault its rule names (not another symptom, nor a category inferred)
            return _kills_ranks(g, category) and not (symptom and (g.first_hit.rule.rule.reports == "device_symptom"
                                                                   or g.finding.basis != "rule"))

        # a specific rule (the driver's Xid line) before a generic symptom (nvidia-smi's view of it)
        killers = [g for g in specific if kills(g)]
        seen = {id(g) for g in killers}
        killers += [g for g in candidates if kills(g) and id(g) not in seen]
        # a CUDA error that names no cause after the device fault that explains it (sorted: stable otherwise)
        killers.sort(key=lambda g: g.first_hit.rule.rule.reports == "device_symptom")
        if killers:
            chosen = {id(g) for g in killers}
            return killers + [g for g in specific if id(g) not in chosen]
    return specific


def _stalled_rank(ordered: list[Group], cascades: list[Group]) -> Group | None:
    """The earliest warning that a rank's data stream stalled, when the failure is only a collective timeout.

    A streamed dataset that loses its remote host retries (a warning per attempt) and meanwhile holds its rank short
    of the next collective; the peers time out. Alone such a warning is no failure (the retry may succeed), so it
    leads only a timeout cascade that nothing else explains.
    """
    if not any(g.finding.category == "nccl_timeout" for g in cascades):
        return None
    return next(
        (g for g in ordered
         if g.finding.severity == "warning" and g.first_hit.rule.rule.role == "root" and _tier(g) != "catchall"
         and g.finding.category in RANK_STALLERS),
        None,
    )


def _wrapper_detail(cascades: list[Group]) -> Group:
    """The earliest cascade, or the detail its own message gives when it is a wrapper that names no category.

    A driver's report that a remote worker died (Ray's ``ActorDiedError: The actor died unexpectedly``, EC141, category
    ``other``) goes on, as the rest of the same exception message, with the worker's fields and how it died (``The
    actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR ...``, OOM026): read as one
    message, that detail is what the wrapper says, and when it names a category it leads the wrapper. It must come
    from the same process's output within the message's few lines, so another worker's report is never taken.
    """
    first = cascades[0]
    if first.finding.category != "other":
        return first
    head = first.first_hit
    for g in cascades[1:]:
        hit = g.first_hit
        if (g.finding.category != "other" and hit.source_index == head.source_index
                and hit.line.stream == head.line.stream
                and 0 < hit.line.lineno - head.line.lineno <= WRAPPER_MESSAGE_LINES):
            return g
    return first


def _first_collective_phase(root: Group, ordered: list[Group]) -> str | None:
    """The phase of the call that issued the failing communicator's first collective, for a root whose failure is
    NCCL's communicator set-up (``phase_at_first_collective``: a socket, shm or transport error, a duplicate GPU).

    NCCL builds a communicator lazily, at a process group's first collective: in a DDP or FSDP job that is the
    wrapper's parameter broadcast, elsewhere the first step's all-reduce. The set-up line itself carries no frames;
    the NCCL error that the collective then raises does (``DistBackendError: NCCL error in: ...``). The first NCCL
    finding whose phase its traceback's frames told names the call; markers are not enough (a barrier after the
    wrapper's marker is still the job's first collective, not the wrap)."""
    for g in ordered:
        if (g is not root and g.first_hit.phase_by_frames and g.finding.category in EXPLAINED_BY_KILLED_RANKS
                and g.finding.phase in AFTER_SETUP):
            return g.finding.phase
    return None


# cascades that only report that the program's tasks ended (srun's per-task exit, torchrun's summary): they carry
# no cause of their own, so a catch-all of the program's own output printed before them explains them
EXIT_REPORT_CATEGORIES = frozenset({"slurm", "launcher"})


def _own_catchall_before_exit_reports(catchall: list[Group], cascades: list[Group]) -> Group | None:
    """The first catch-all of the program's own output (not Slurm's or a launcher's: their `srun: error:` lines
    are reports too) printed before every cascade, when every cascade is an exit report; else None."""
    if any(g.finding.category not in EXIT_REPORT_CATEGORIES for g in cascades):
        return None
    first_cascade = min(by_time(g) for g in cascades)
    own = [g for g in catchall if g.finding.category not in EXIT_REPORT_CATEGORIES and by_time(g) < first_cascade]
    return own[0] if own else None


def rank(groups: list[Group]) -> tuple[list[Finding], int | None]:
    """Order the findings and choose the root cause; returns (findings, index of the root or None)."""
    ordered = sorted(groups, key=by_time)
    errors = [g for g in ordered if g.finding.severity == "error"]
    # a catch-all may be a warning (an NCCL WARN line is context next to an error): it still speaks when alone
    catchall = [g for g in ordered if _tier(g) == "catchall" and g.finding.severity != "info"]
    # the program said it finished its work (a test's verified summary, the trainer's end of fit) after a catch-all's
    # line: that line (an NCCL WARN, a stray error word) did not end the job, so it does not speak for it
    done = [g for g in ordered if g.first_hit.rule.rule.completes]
    if done:
        last_done = by_time(done[-1])
        catchall = [g for g in catchall if by_time(g) > last_done]
    root_role = [g for g in errors if g.first_hit.rule.rule.role == "root" and _tier(g) != "catchall"]
    specific = [g for g in root_role if _tier(g) == "specific"]
    cascades = [g for g in errors if g.first_hit.rule.rule.role == "cascade" and _tier(g) != "catchall"]

    root: Group | None = None
    confidence = 0.0  # set with the root
    # A generic error printed after the first NCCL watchdog timeout is its consequence (the watchdog aborts the
    # communicator and every rank's pending call raises): the timeout, and not what it raised, leads.
    timeouts = [g for g in cascades if g.finding.category == "nccl_timeout"]
    if not specific and root_role and timeouts and by_time(timeouts[0]) < by_time(root_role[0]):
        # a lost GPU or a killed rank is not the timeout's doing, nor an error raised in data loading (an aborted
        # communicator raises in the collective's call, not in the data reader of a rank that never reached it)
        root_role = [g for g in root_role
                     if any(_kills_ranks(g, c) for c in RANK_KILLERS) or g.finding.category in RANK_STALLERS]
    # a cascade that kills a rank (torchrun's first failure by SIGKILL, LA291) explains its peers' NCCL errors too
    killing = [g for g in cascades if any(_kills_ranks(g, c) for c in RANK_KILLERS)]
    specific = killers_first(specific, root_role + killing)
    if specific or root_role:
        pool = specific or root_role
        root = pool[0]
        confidence = root.finding.confidence
        if len({g.first_hit.rule.rule.code for g in pool}) > 1:
            confidence *= CONTESTED_FACTOR
    elif cascades and (own := _own_catchall_before_exit_reports(catchall, cascades)) is not None:
        # the only cascades are a launcher's or Slurm's report that tasks exited (srun's `Exited with exit code`):
        # the program's own words before it (a CUDA check's `Failed: Cuda error`), though a catch-all, say why
        root = own
        confidence = root.finding.confidence
        root.finding.severity = "error"
    elif cascades and (stalled := _stalled_rank(ordered, cascades)) is not None:
        # nothing but the timeout cascade failed: a rank's stalled data stream (a warning while it retried) is why
        root = stalled
        confidence = min(root.finding.confidence, CASCADE_ROOT_CONFIDENCE)
        root.finding.severity = "error"  # the job failed on it: it is no longer only a warning
    elif cascades:
        # a rank killed from outside (torchrun's first failure by SIGKILL, LA291) leads its peers' timeouts
        root = _wrapper_detail(killers_first(cascades, []))
        confidence = min(root.finding.confidence, CASCADE_ROOT_CONFIDENCE)
    elif catchall:
        root = catchall[0]
        confidence = root.finding.confidence
        root.finding.severity = "error"  # it ended the job: nothing else in the log did

    if root is None:
        findings = [g.finding for g in ordered]
        for f in findings:
            f.role = "cascade" if f.role == "cascade" else "context"
            f.cause_of = None
        return findings, None

    if root.finding.phase == "unknown" and _kills_ranks(root, "hardware"):
        # a device fault's line (nvidia-smi's, the driver's) tells no phase: the CUDA error it explains says when
        # the job met it (its frames, its markers)
        seen = next((g for g in specific if g.first_hit.rule.rule.reports == "device_symptom"
                     and g.finding.phase != "unknown"), None)
        if seen is not None:
            root.finding.phase = seen.finding.phase
    if root.first_hit.rule.rule.phase_at_first_collective:
        root.finding.phase = _first_collective_phase(root, ordered) or root.finding.phase
    rest = [g for g in ordered if g is not root]
    secondary = [g for g in rest if g.first_hit.rule.rule.role != "cascade"]
    consequences = [g for g in rest if g.first_hit.rule.rule.role == "cascade"]
    final = [root] + secondary + consequences
    root.finding.role = "root"
    root.finding.confidence = round(float(confidence), 3)
    root.finding.cause_of = None
    for g in secondary:
        g.finding.role = "context"
        g.finding.cause_of = None
    for g in consequences:
        g.finding.role = "cascade"
        g.finding.cause_of = 0
    return [g.finding for g in final], 0
