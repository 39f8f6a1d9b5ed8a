"""The dashboard's garbage collection: off while a refresh runs, done when it is shown."""

import gc
import weakref
from collections.abc import Iterator

import pytest

from gpuctl.tui.quietgc import QuietGc


class Node:
    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def generations() -> Iterator[list[int]]:
    seen: list[int] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.callbacks.append(callback)
    yield seen
    gc.callbacks.remove(callback)


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_no_automatic_collection_while_it_runs_and_the_collector_is_restored_after() -> None:
    assert gc.isenabled()
    quiet = QuietGc()
    quiet.start()
    try:
        assert not gc.isenabled()
    finally:
        quiet.stop()
    assert gc.isenabled()


def test_what_exists_at_start_is_frozen_out_of_full_collections_until_stop() -> None:
    assert gc.get_freeze_count() == 0
    quiet = QuietGc()
    quiet.start()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        quiet.stop()
    assert gc.get_freeze_count() == 0


def test_someone_elses_freeze_is_left_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        quiet = QuietGc()
        quiet.start()
        quiet.stop()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        quiet = QuietGc()
        quiet.start()
        quiet.stop()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_garbage_cycles_are_collected_at_the_next_idle_call() -> None:
    quiet = QuietGc()
    quiet.start()
    try:
        ref = cycle()
        assert ref() is not None  # a cycle: reference counting alone never frees it
        quiet.idle()
        assert ref() is None
    finally:
        quiet.stop()


def test_young_generations_each_time_everything_every_full_every(generations: list[int]) -> None:
    quiet = QuietGc(full_every=3)
    quiet.start()  # one full collection before it freezes what exists
    generations.clear()
    try:
        for _ in range(6):
            quiet.idle()
    finally:
        quiet.stop()
    assert generations == [1, 1, 2, 1, 1, 2]
    assert quiet.full == 2


def test_idle_does_nothing_when_not_started(generations: list[int]) -> None:
    gc.disable()  # no automatic collection either, to see that idle() makes none
    try:
        QuietGc().idle()
    finally:
        gc.enable()
    assert generations == []
