"""parallel_course.input_pipeline (chapter 11b): slow storage, augmentations seeded per sample, and
the timer that tells waiting for a batch from computing a step."""

import time

import pytest
import torch
from torch.utils.data import DataLoader

from parallel_course.input_pipeline import NoisyCopies, SeededNoisyCopies, SlowStorage, timed_steps


def test_slow_storage_waits_and_gives_each_index_its_own_sample():
    storage = SlowStorage(size=8, features=4, read_seconds=0.01)
    start = time.perf_counter()
    x, y = storage[3]
    assert time.perf_counter() - start >= 0.01
    assert torch.equal(x, storage[3][0]) and not torch.equal(x, storage[4][0])
    assert x.shape == (4,) and torch.allclose(y, x.sum(0, keepdim=True))


def test_noise_from_the_global_generator_repeats_whenever_the_seed_does():
    def noise():
        torch.manual_seed(0)
        return [NoisyCopies(4)[i][1] for i in range(4)]

    first = noise()
    assert first == noise() and len(set(first)) == 4  # the same seed: the same draws, whatever the index


@pytest.mark.parametrize("num_workers", [0, 2])
def test_noise_seeded_per_sample_does_not_depend_on_workers_or_order(num_workers):
    data = SeededNoisyCopies(12, seed=3)
    alone = {i: data[i][1] for i in reversed(range(12))}
    loader = DataLoader(
        data, batch_size=5, shuffle=True, num_workers=num_workers, generator=torch.Generator().manual_seed(0)
    )
    drawn = {i: n for index, noise, _ in loader for i, n in zip(index.tolist(), noise.tolist())}
    assert drawn == alone


def test_noise_seeded_per_sample_changes_with_the_epoch_and_the_seed():
    data = SeededNoisyCopies(4, seed=3)
    epoch0 = [data[i][1] for i in range(4)]
    data.set_epoch(1)
    assert all(a != b for a, b in zip(epoch0, [data[i][1] for i in range(4)]))
    assert epoch0 != [SeededNoisyCopies(4, seed=4)[i][1] for i in range(4)]


def test_timed_steps_tells_waiting_from_computing():
    def slow_batches():
        while True:
            time.sleep(0.02)
            yield None

    calls = []
    t = timed_steps(slow_batches(), lambda batch: calls.append(batch), steps=3)
    assert len(calls) == 4  # one warm-up batch, then the timed steps
    # The steps' CPU time: a busy machine can pause this process mid-step, never make it compute more.
    assert t["wait"] >= 0.02 and t["compute_cpu"] < t["wait"]
    assert t["total"] == pytest.approx(t["wait"] + t["compute"])
    assert t["wait_share"] == pytest.approx(t["wait"] / t["total"])
    # Each timed step's own (wait, compute), in order: what chapter 11b's timeline draws.
    assert len(t["per_step"]) == 3 and all(wait >= 0.02 for wait, _ in t["per_step"])
    assert sum(wait for wait, _ in t["per_step"]) / 3 == pytest.approx(t["wait"])
    assert sum(compute for _, compute in t["per_step"]) / 3 == pytest.approx(t["compute"])


def test_timed_steps_tells_the_steps_cpu_time_from_their_wall_time():
    """A step that sleeps takes wall time and no CPU (as a step whose core another process holds);
    one that computes takes CPU. Both hold on a busy machine: load lengthens the wall time only."""

    def spin(batch):
        end = time.thread_time() + 0.01
        while time.thread_time() < end:
            pass

    sleeping = timed_steps(iter(range(4)), lambda batch: time.sleep(0.02), steps=3)
    computing = timed_steps(iter(range(4)), spin, steps=3)
    assert sleeping["compute"] >= 0.02 and sleeping["compute_cpu"] < 0.005
    # Two clocks: the CPU time may pass the wall time by their granularity, never by more.
    assert computing["compute_cpu"] >= 0.01 and computing["compute"] >= 0.01
