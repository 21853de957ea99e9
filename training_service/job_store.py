"""Training jobs on disk: the request, the state, and every event, so a job outlives any stream and a restart.

<root>/<job_id>/job.json      state, steps, adapter, error, times
<root>/<job_id>/events.jsonl  one event per line: {"sequence", "time", "kind", "data"}; appended, flushed, fsynced
                              (training_service.event_log keeps the recent ones in memory for watchers)
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import shutil

from service_kit.auth import Caller
from service_kit.errors import FailedPrecondition, NotFound, clip
from training_service.event_log import EventLog

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "SUSPENDED"}


@dataclass
class JobRecord:
    job_id: str
    family: str
    request_json: str
    state: str = "PENDING"
    steps_completed: int = 0
    total_steps: int = 0
    last_sequence: int = 0
    adapter_id: str = ""
    error: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    owner: str = "anonymous"  # the identity that started it; only it (or an admin) sees and acts on it
    train_seconds: float = 0.0  # wall time spent RUNNING, up to the last time it stopped running
    running_since: float = 0.0  # when it last began RUNNING; 0 while not running

    def train_time_s(self, now: float | None = None) -> float:
        """Wall time spent training so far, the current run included."""
        running = (now or time.time()) - self.running_since if self.running_since else 0.0
        return self.train_seconds + running


class JobStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, JobRecord] = {}
        self._logs: dict[str, EventLog] = {}  # opened on first use: a restart does not scan every old log
        for path in sorted(self.root.glob("*/job.json")):
            record = JobRecord(**json.loads(path.read_text()))
            # The log is the truth: job.json is rewritten on state changes, not on every event.
            record.last_sequence = max(record.last_sequence, EventLog.last_sequence_on_disk(path.parent / "events.jsonl"))
            self.jobs[record.job_id] = record
            if record.state not in TERMINAL:  # its child died with the previous service process
                self._fail_interrupted(record)

    def _fail_interrupted(self, record: JobRecord) -> None:
        """A job the previous process never finished: FAILED, with a final event, and where it can resume from."""
        message = "the training service stopped without draining while this job ran" + self.resume_hint(record)
        self.append(record, "finished", {"state": "FAILED", "steps_completed": record.steps_completed,
                                         "message": message})
        if record.running_since:  # it ran until its last recorded change, as far as anyone can tell
            record.train_seconds += max(0.0, record.updated - record.running_since)
            record.running_since = 0.0
        record.state, record.error, record.updated = "FAILED", message, time.time()
        self._write(record)

    def resume_hint(self, record: JobRecord) -> str:
        """For a job that ended badly: where it can continue from, or '' when it saved nothing."""
        saved = [e["data"]["step"] for e in self.all_events(record.job_id) if e["kind"] == "checkpoint"]
        if saved and (self.dir(record.job_id) / "checkpoint" / "identity.json").is_file():
            return f"; its checkpoint at step {saved[-1]} resumes with resume_job_id={record.job_id}"
        return ""

    def dir(self, job_id: str) -> Path:
        return self.root / job_id

    def create(self, record: JobRecord) -> JobRecord:
        self.dir(record.job_id).mkdir(parents=True)
        self.jobs[record.job_id] = record
        self._write(record)
        return record

    def get(self, job_id: str, caller: Caller | None = None) -> JobRecord:
        """The job; with a `caller`, only a job it may see (another's answers like an unknown one)."""
        record = self.jobs.get(job_id)
        if record is None or (caller is not None and not caller.may_act_on(record.owner)):
            raise NotFound(f"no training job {clip(job_id)}", reason="JOB_NOT_FOUND")
        return record

    def visible(self, caller: Caller) -> list[JobRecord]:
        """The caller's jobs (an admin's: all), newest first."""
        mine = [r for r in self.jobs.values() if caller.may_act_on(r.owner)]
        return sorted(mine, key=lambda r: (r.created, r.job_id), reverse=True)

    def delete(self, record: JobRecord) -> None:
        """Removes an ended job's folder: record, events, checkpoint, samples."""
        if record.state not in TERMINAL:
            raise FailedPrecondition(f"job {record.job_id} is {record.state}; stop it before deleting it",
                                     reason="JOB_NOT_ENDED")
        trash = self.root / f".deleting-{record.job_id}"
        os.replace(self.dir(record.job_id), trash)
        del self.jobs[record.job_id]
        self._logs.pop(record.job_id, None)
        shutil.rmtree(trash, ignore_errors=True)

    def update(self, record: JobRecord, **fields) -> None:
        now = time.time()
        if fields.get("state") == "RUNNING" and not record.running_since:
            record.running_since = now
        elif "state" in fields and fields["state"] != "RUNNING" and record.running_since:
            record.train_seconds, record.running_since = record.train_time_s(now), 0.0
        for k, v in fields.items():
            setattr(record, k, v)
        record.updated = now
        self._write(record)

    def log(self, job_id: str) -> EventLog:
        if job_id not in self._logs:
            self._logs[job_id] = EventLog(self.dir(job_id) / "events.jsonl")
        return self._logs[job_id]

    def append(self, record: JobRecord, kind: str, data: dict) -> dict:
        event = {"sequence": record.last_sequence + 1, "time": time.time(), "kind": kind, "data": data}
        self.log(record.job_id).append(event)
        record.last_sequence = event["sequence"]
        return event

    def remember(self, record: JobRecord, kind: str, data: dict) -> dict:
        """An event that could not be written: kept in memory for live watchers (append failed)."""
        event = {"sequence": record.last_sequence + 1, "time": time.time(), "kind": kind, "data": data}
        self.log(record.job_id).remember(event)
        record.last_sequence = event["sequence"]
        return event

    def events(self, job_id: str, from_sequence: int = 0, limit: int | None = None) -> list[dict]:
        """Events from `from_sequence` on: the recent ones from memory, older ones a bounded chunk from disk."""
        return self.log(job_id).read(from_sequence, limit)

    def all_events(self, job_id: str):
        """Every event of a job, chunk by chunk."""
        next_seq = 1
        while True:
            chunk = self.events(job_id, next_seq)
            if not chunk:
                return
            yield from chunk
            next_seq = chunk[-1]["sequence"] + 1

    def _write(self, record: JobRecord) -> None:
        tmp = self.dir(record.job_id) / "job.json.tmp"
        try:
            tmp.write_text(json.dumps(asdict(record)))
            os.replace(tmp, self.dir(record.job_id) / "job.json")
        except OSError:  # a full disk: job.json keeps its last whole version, and no temporary is left
            tmp.unlink(missing_ok=True)
            raise
