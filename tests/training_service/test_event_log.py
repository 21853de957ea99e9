"""A job's event log: watchers of recent events read memory, older replays read bounded chunks from disk,
a restart rebuilds the index, and a job takes a bounded number of watchers."""
import asyncio

import pytest

from service_kit.errors import ResourceExhausted
from training_service.event_log import REPLAY_CHUNK, TAIL
from training_service.job_store import JobRecord, JobStore
from training_service.jobs import MAX_WATCHERS_PER_JOB, JobManager

EVENTS = 2600  # more than the in-memory tail plus one replay chunk


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "jobs")
    record = store.create(JobRecord("job-1", "zimage", "{}"))
    for i in range(EVENTS):
        store.append(record, "step", {"step": i + 1})
    return store


def test_recent_events_come_from_memory(store):
    path = store.dir("job-1") / "events.jsonl"
    path.rename(path.with_suffix(".moved"))  # a read that touched the disk would now find nothing
    recent = store.events("job-1", EVENTS - 10)
    assert [e["sequence"] for e in recent] == list(range(EVENTS - 10, EVENTS + 1))
    assert store.log("job-1").disk_reads == 0


def test_an_old_replay_is_read_in_bounded_chunks_and_survives_a_restart(store):
    first = store.events("job-1", 1)
    assert [e["sequence"] for e in first] == list(range(1, REPLAY_CHUNK + 1))
    middle = store.events("job-1", 1000, limit=3)
    assert [e["sequence"] for e in middle] == [1000, 1001, 1002]
    assert [e["sequence"] for e in store.all_events("job-1")] == list(range(1, EVENTS + 1))
    restarted = JobStore(store.root)
    assert [e["data"]["step"] for e in restarted.events("job-1", 777, limit=2)] == [777, 778]
    assert restarted.events("job-1", EVENTS - TAIL + 1)[0]["sequence"] == EVENTS - TAIL + 1
    assert restarted.log("job-1").last_sequence == EVENTS + 1  # the restart ended the interrupted job


def test_a_job_takes_a_bounded_number_of_watchers(store, tmp_path):
    async def main():
        jobs = JobManager(store, tmp_path / "adapters")
        store.update(store.get("job-1"), state="RUNNING", last_sequence=EVENTS)
        watchers = [jobs.watch("job-1", EVENTS) for _ in range(MAX_WATCHERS_PER_JOB)]
        for w in watchers:
            assert (await w.__anext__())["sequence"] == EVENTS
        extra = jobs.watch("job-1", EVENTS)
        with pytest.raises(ResourceExhausted):
            await extra.__anext__()
        await watchers[0].aclose()  # a watcher that leaves frees its place
        assert (await jobs.watch("job-1", EVENTS).__anext__())["sequence"] == EVENTS
        for w in watchers[1:]:
            await w.aclose()

    asyncio.run(main())


def test_a_restart_numbers_new_events_after_the_log_not_after_job_json(store):
    """job.json is written on state changes only; a restart used to number the interrupted job's final event
    after job.json's last_sequence (0 here), repeating a sequence the log already had."""
    restarted = JobStore(store.root)
    events = list(restarted.all_events("job-1"))
    assert [e["sequence"] for e in events] == list(range(1, EVENTS + 2))
    assert events[-1]["kind"] == "finished" and restarted.get("job-1").last_sequence == EVENTS + 1
