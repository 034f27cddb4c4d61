"""A stage's grouped input handed to the workers as they free up (pipeline/runners/balance.py):
every key once, the same outputs, and a slow worker takes fewer keys than a fast one."""
from __future__ import annotations

import os
import time

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from test_forkserver import grouping_buffer, pairs

from pipeline.runners import balance
from pipeline.runners.options import direct_pipeline


def test_batches_shrink_as_the_queue_empties_and_a_light_stage_splits_the_rest():
    units = [bytes([i]) for i in range(16)]
    queue = balance.Queue(units, 2)
    sizes = [len(queue.take()) for _ in range(4)]
    assert sizes == [4, 3, 3, 2]  # ceil(remaining / 4)
    assert [len(queue.take(light=True)), len(queue.take()), len(queue.take())] == [2, 2, 0]  # the 4 left, 2 a worker
    light = balance.Queue(units, 3)
    assert len(light.take()) == 3 and sorted(b for _ in range(3) for b in light.take(light=True)) == units[3:]
    assert light.take() == [] and balance.Queue([], 2).take() == []


def test_units_are_beams_grouped_bytes_a_key_each():
    """Each unit is one key with all its values, encoded as Beam would send it; together, Beam's
    one part. A buffer partitioned already is not cut again."""
    data = pairs(300)
    units = balance.units(grouping_buffer(data))
    whole = grouping_buffer(data)
    assert len(units) == 100 and b"".join(units) == b"".join(whole.partition(1)[0])
    assert balance.units(whole) is None and balance.units(object()) is None


class Slow(beam.DoFn):
    """Notes the worker of each key it gets; each key takes 0.01 s, or 0.15 s on the worker that
    made the ``slow`` file first."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def setup(self) -> None:
        try:
            os.close(os.open(os.path.join(self.folder, "slow"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            self.delay = 0.15
        except FileExistsError:
            self.delay = 0.01

    def process(self, item: tuple[int, list[int]]):
        time.sleep(self.delay)
        with open(os.path.join(self.folder, f"{os.getpid()}.{'slow' if self.delay > 0.1 else 'fast'}"), "a") as out:
            out.write(f"{item[0]}\n")
        yield item[0], sorted(item[1])


def test_a_slow_worker_takes_fewer_keys_and_every_key_is_done_once(tmp_path):
    """Beam would give each of 2 workers 12 of 24 keys; here the slow one's first batch (6 keys,
    0.9 s) is all it does while the fast one takes the rest."""
    with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
        keyed = p | beam.Create([(k % 24, k) for k in range(48)]) | beam.GroupByKey()
        done = keyed | beam.ParDo(Slow(str(tmp_path)))
        assert_that(done, equal_to([(k, [k, k + 24]) for k in range(24)]))
    taken = {name.split(".")[1]: [int(k) for k in (tmp_path / name).read_text().split()]
             for name in os.listdir(tmp_path) if "." in name}
    assert sorted(k for keys in taken.values() for k in keys) == list(range(24))
    assert len(taken.get("slow", [])) < 12 < len(taken["fast"]), taken
