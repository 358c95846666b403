"""The engine's thread count follows the CPUs that other processes leave free (cpu_share)."""

import multiprocessing
import os
import time

import pytest
import torch

from playground.engines.cpu_share import EVERY_S, CpuShare, read_times, threads_for
from playground.evaluation.cpu_contention import spin_until


def test_a_thread_goes_where_others_take_a_cpu_and_comes_back_only_where_most_of_one_is_free():
    assert threads_for(free=2.0, most=2, current=2) == 2
    assert threads_for(free=1.15, most=2, current=2) == 1   # a browser drawing the page beside the engine
    assert threads_for(free=1.7, most=2, current=2) == 2    # between the two marks the count stays
    assert threads_for(free=1.7, most=2, current=1) == 1
    assert threads_for(free=1.85, most=2, current=1) == 2
    assert threads_for(free=-0.5, most=2, current=2) == 1   # never fewer than one
    assert threads_for(free=7.9, most=4, current=1) == 4    # never more than it started with
    assert threads_for(free=2.2, most=8, current=8) == 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to leave one to another process")
def test_the_engine_leaves_a_cpu_another_process_keeps_busy_and_takes_it_back_when_it_is_free():
    started = torch.get_num_threads()
    assert read_times(frozenset(os.sched_getaffinity(0))) is not None
    share = CpuShare(most=2)
    try:
        hog = multiprocessing.get_context("spawn").Process(target=spin_until, args=(time.monotonic() + 3 * EVERY_S,))
        hog.start()
        time.sleep(1.5 * EVERY_S)
        assert share.adjust() == 1 and torch.get_num_threads() == 1
        hog.join()
        share.adjust()   # the second that ends with the other process's last
        time.sleep(1.2 * EVERY_S)
        assert share.adjust() == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(started)
