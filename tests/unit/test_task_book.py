"""The proxy's sampling tasks as plain state: statuses, TTLs, eviction and pages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.relay.task_book import (
    MAX_TASKS,
    PAGE_SIZE,
    POLL_INTERVAL_MS,
    TASK_ID_PREFIX,
    TaskBook,
    TaskError,
    is_own_task,
    iso,
)
from tests.clock import Clock


def book(ttl_max_ms: int = 60_000) -> tuple[TaskBook, Clock]:
    clock = Clock(1_764_000_000.0)
    return TaskBook(ttl_max_ms=ttl_max_ms, clock=clock), clock


@pytest.mark.parametrize(
    ("requested", "granted"),
    [
        (10_000, 10_000),
        (60_000, 60_000),
        (600_000, 60_000),
        (None, 60_000),
        (0, 60_000),
        (-5, 60_000),
        ("1000", 60_000),
        (True, 60_000),
        (1500.7, 1501),
        (0.5, 1),  # rounded up: 0 ms was a task gone before it could be polled
        (float("inf"), 60_000),  # `1e400` in JSON: `int()` of it raised and ended the session
        (float("-inf"), 60_000),
        (float("nan"), 60_000),
        (1e300, 60_000),
    ],
)
def test_ttl_is_the_request_within_the_cap(requested: object, granted: int) -> None:
    tasks, _ = book()
    task, _ = tasks.create(requested)
    assert task.ttl_ms == granted
    assert task.wire()["ttl"] == granted


def test_a_task_asking_for_less_than_a_millisecond_is_there_when_created() -> None:
    """0.5 ms was cut to 0: the task had expired when the server got its id."""
    tasks, _ = book()
    task, _ = tasks.create(0.5)
    assert tasks.get(task.task_id) is task


def test_a_task_starts_working_and_shows_what_the_spec_asks() -> None:
    tasks, clock = book()
    task, evicted = tasks.create(30_000)
    assert evicted == []
    wire = task.wire()
    assert wire == {
        "taskId": task.task_id,
        "status": "working",
        "createdAt": iso(clock.now),
        "lastUpdatedAt": iso(clock.now),
        "ttl": 30_000,
        "pollInterval": 1000,
    }
    assert wire["createdAt"].endswith("Z")
    assert "T" in wire["createdAt"]
    assert is_own_task(task.task_id)
    assert task.task_id.startswith(TASK_ID_PREFIX)
    assert not is_own_task("someone-else")
    assert not is_own_task(7)


def test_terminal_status_never_changes() -> None:
    tasks, clock = book()
    task, _ = tasks.create(None)
    clock.now += 2
    assert tasks.finish(task, "completed", ("result", {"x": 1}))
    assert task.wire()["lastUpdatedAt"] == iso(clock.now)
    assert not tasks.finish(task, "failed", ("error", {"code": 1, "message": "no"}), "late")
    assert task.status == "completed"
    assert task.outcome == ("result", {"x": 1})
    with pytest.raises(TaskError, match="already in terminal status 'completed'"):
        tasks.cancel(task.task_id)


def test_cancel_marks_the_task_and_its_result_is_the_cancellation_error() -> None:
    tasks, _ = book()
    task, _ = tasks.create(None)
    assert tasks.cancel(task.task_id) is task
    assert task.status == "cancelled"
    assert task.outcome is not None
    assert task.outcome[1]["code"] == -32800


def test_expired_tasks_are_forgotten() -> None:
    tasks, clock = book(ttl_max_ms=1000)
    task, _ = tasks.create(None)
    clock.now += 0.999
    assert tasks.get(task.task_id) is task
    clock.now += 0.002
    with pytest.raises(TaskError, match="Task not found"):
        tasks.get(task.task_id)
    assert tasks.expire() == [task]
    assert tasks.tasks == {}


def test_unknown_ids_and_cursors_are_refused() -> None:
    tasks, _ = book()
    unknowns: list[object] = ["nope", None, 3, TASK_ID_PREFIX + "forged", [], {}]
    for unknown in unknowns:
        with pytest.raises(TaskError):
            tasks.get(unknown)
    with pytest.raises(TaskError, match="Invalid cursor"):
        tasks.page("nope")


def test_beyond_the_cap_the_oldest_finished_task_makes_room() -> None:
    tasks, _ = book()
    first, _ = tasks.create(None)
    second, _ = tasks.create(None)
    tasks.finish(second, "completed", ("result", {}))
    for _ in range(MAX_TASKS - 2):
        tasks.create(None)
    _, evicted = tasks.create(None)
    assert evicted == [second]  # the finished one, although `first` is older
    assert first.task_id in tasks.tasks
    assert len(tasks.tasks) == MAX_TASKS


@given(st.integers(min_value=0, max_value=3 * PAGE_SIZE + 3))
def test_pages_list_every_task_once_in_order(count: int) -> None:
    tasks, _ = book()
    created = [tasks.create(None)[0].task_id for _ in range(count)]
    listed: list[str] = []
    cursor = None
    while True:
        page, cursor = tasks.page(cursor)
        assert len(page) <= PAGE_SIZE
        listed += [task.task_id for task in page]
        if cursor is None:
            break
    assert listed == created


def test_a_cursor_outlives_the_task_it_was_given_after() -> None:
    """A page's cursor stays good when the last task of that page expires (or is dropped) before
    the next page is asked for: it was that task's id, and the listing failed with -32602."""
    tasks, clock = book()
    created = [tasks.create(1000 if n == PAGE_SIZE - 1 else None)[0].task_id for n in range(PAGE_SIZE + 5)]
    first, cursor = tasks.page(None)
    assert [task.task_id for task in first] == created[:PAGE_SIZE]
    assert cursor is not None
    clock.now += 1.5  # the last task of the first page is gone
    second, after = tasks.page(cursor)
    assert [task.task_id for task in second] == created[PAGE_SIZE:]
    assert after is None
    forged = (
        created[0],
        "after-999",
        "after--1",
        "after-x",
        "after-",
        "after-0",
        "after-" + "9" * 5000,
        "after-²",
    )
    for forged_cursor in forged:  # task ids, cursors never given, numbers too long to read
        with pytest.raises(TaskError, match="Invalid cursor"):
            tasks.page(forged_cursor)


def test_a_task_that_ends_just_before_its_ttl_is_there_for_the_next_poll() -> None:
    """A Claude call that ends in the last moments of its task's TTL has been paid for: its answer
    was forgotten at the TTL, before a server polling every `pollInterval` (as the proxy tells it)
    could see the task completed and fetch it. A finished task stays a few poll intervals longer."""
    tasks, clock = book()
    task, _ = tasks.create(10_000)
    clock.now += 9.9
    assert tasks.finish(task, "completed", ("result", {"x": 1}))
    clock.now += POLL_INTERVAL_MS / 1000 + 0.05  # past the TTL: the poller's next tasks/get
    assert tasks.get(task.task_id).status == "completed"
    assert [listed.task_id for listed in tasks.page(None)[0]] == [task.task_id]
    clock.now += 0.8  # its tasks/result
    assert tasks.get(task.task_id).outcome == ("result", {"x": 1})
    clock.now += 10  # long past both
    with pytest.raises(TaskError, match="Task not found"):
        tasks.get(task.task_id)
    assert tasks.expire() == [task]


def test_a_task_that_ended_long_before_its_ttl_is_forgotten_at_its_ttl() -> None:
    tasks, clock = book()
    task, _ = tasks.create(10_000)
    tasks.finish(task, "completed", ("result", {}))
    clock.now += 10.001
    with pytest.raises(TaskError, match="Task not found"):
        tasks.get(task.task_id)


def test_beyond_the_cap_a_task_whose_answer_was_fetched_makes_room_first() -> None:
    tasks, _ = book()
    unfetched, _ = tasks.create(None)
    fetched, _ = tasks.create(None)
    tasks.finish(unfetched, "completed", ("result", {}))
    tasks.finish(fetched, "completed", ("result", {}))
    fetched.fetched = True
    for _ in range(MAX_TASKS - 2):
        tasks.create(None)
    _, evicted = tasks.create(None)
    assert evicted == [fetched]
    assert unfetched.task_id in tasks.tasks


@pytest.mark.parametrize("finished", [False, True])
def test_a_task_evicted_before_its_ttl_is_looked_up_as_evicted_until_then(finished: bool) -> None:
    """A task dropped to make room was looked up as any id never issued, "Task not found", though
    its TTL had not passed (a server polling it could only think it lost): the lookup still fails
    as the spec has it, and says the task was evicted and by which limit, until its TTL passes."""
    tasks, clock = book(ttl_max_ms=10_000)
    first, _ = tasks.create(None)
    if finished:
        tasks.finish(first, "completed", ("result", {}))
    for _ in range(MAX_TASKS - 1):
        tasks.create(None)
    _, evicted = tasks.create(None)
    assert evicted == [first]
    assert first.evicted
    for lookup in (tasks.get, tasks.cancel):
        with pytest.raises(
            TaskError, match=r"^Failed to retrieve task: Task not found: it was evicted"
        ) as caught:
            lookup(first.task_id)
        assert "MAX_TASKS" in str(caught.value)
        assert str(MAX_TASKS) in str(caught.value)
    clock.now += 10.001  # its TTL has passed: it would have been forgotten anyway
    with pytest.raises(TaskError, match=r"^Failed to retrieve task: Task not found$"):
        tasks.get(first.task_id)
    tasks.expire()
    assert tasks.evictions == {}


def test_an_expired_task_is_not_said_to_be_evicted() -> None:
    tasks, clock = book(ttl_max_ms=1000)
    task, _ = tasks.create(None)
    clock.now += 1.001
    _, gone = tasks.create(None)
    assert gone == [task]
    assert not task.evicted
    with pytest.raises(TaskError, match=r"^Failed to retrieve task: Task not found$"):
        tasks.get(task.task_id)


def test_the_evictions_remembered_are_bounded_and_end_with_the_session() -> None:
    tasks, _ = book()
    for _ in range(3 * MAX_TASKS):
        tasks.create(None)
    assert len(tasks.evictions) == MAX_TASKS
    tasks.clear()
    assert (tasks.tasks, tasks.evictions) == ({}, {})
