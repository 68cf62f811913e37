"""The NCCL flight-recorder dumps captured on an H200 (tests/data/flight_recorder/h200/) are what their README says:
loadable without running code, version 2.10, the collectives recorded, and the timed-out one in the timeout dumps."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "flight_recorder" / "h200"
TOP = {"version", "comm_lib_version", "pg_config", "pg_status", "entries"}


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # no global may load: plain containers and scalars only
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def _load(name: str) -> dict:
    return _Plain(io.BytesIO((DATA / name).read_bytes())).load()


@pytest.mark.parametrize("name", ["nccl_dump.pkl", "nccl_dump_legacy_env.pkl", "timeout_old_env/nccl_trace_rank_0",
                                  "timeout_new_env/nccl_trace_rank_0"])
def test_pickles_are_plain_version_2_10_with_nccl_entries(name):
    dump = _load(name)
    assert set(dump) == TOP and dump["version"] == "2.10" and dump["comm_lib_version"] == "2.28.9"
    ops = [(e["pg_id"], e["collective_seq_id"], e["profiling_name"]) for e in dump["entries"]]
    assert ops[:7] == [(0, i + 1, op) for i, op in enumerate(
        ["nccl:all_reduce", "nccl:_all_gather_base", "nccl:_reduce_scatter_base", "nccl:broadcast",
         "nccl:all_to_all", "nccl:all_reduce", "nccl:all_reduce_barrier"])]
    assert ops[7:9] == [(1, 1, "nccl:all_reduce"), (1, 2, "nccl:all_gather")]
    assert all(e["frames"] and {"name", "filename", "line"} <= set(e["frames"][0]) for e in dump["entries"])


@pytest.mark.parametrize("folder", ["timeout_old_env", "timeout_new_env"])
def test_timeout_dump_ends_with_the_scheduled_collective_the_watchdog_named(folder):
    dump = _load(f"{folder}/nccl_trace_rank_0")
    last = dump["entries"][-1]
    assert (last["collective_seq_id"], last["state"], last["timeout_ms"]) == (8, "scheduled", 5000)
    assert last["input_sizes"] == [[262144]] and not last["retired"]
    assert dump["pg_status"]["0"]["last_enqueued_collective"] == 8
    assert dump["pg_status"]["0"]["last_completed_collective"] == 7
    stderr = (DATA / folder / "stderr.txt").read_text()
    assert "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE" in stderr
    assert "ProcessGroupNCCL preparing to dump debug info" in stderr


def test_json_dump_has_the_same_collectives_without_frames():
    data = json.loads((DATA / "nccl_dump.json").read_bytes())
    pkl = _load("nccl_dump.pkl")
    assert set(data) == TOP | {"nccl_comm_state"} and data["version"] == "2.10"
    assert [e["record_id"] for e in data["entries"]] == [e["record_id"] for e in pkl["entries"]]
    assert all("frames" not in e for e in data["entries"])
    assert isinstance(data["pg_status"]["0"]["last_enqueued_collective"], str)


def test_the_generic_recorder_saw_no_nccl_collectives():
    assert not _load("nccl_dump_generic.pkl")["entries"]
    assert not json.loads((DATA / "nccl_dump_generic.json").read_bytes()).get("entries")
