"""CompactSlots.reserve, which runs when a mask changes after an XLA step was
traced: growable slots grow to a row for every permitted row; slots of fixed
capacity (a whole table's on a parameter server, a sharded table's) keep their
shape, and say what XLA steps will skip."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding.optimizers._compact_slots import CompactSlots, SlotSpec

SPECS = (SlotSpec("momentum", 0.0), SlotSpec("velocity", 0.5))


def _slots(fixed_capacity: bool) -> CompactSlots:
    table = tf.Variable(np.zeros((8, 2), np.float32))
    slots = CompactSlots(table, SPECS, capacity=2, name="table", fixed_capacity=fixed_capacity)
    slots.used_under_xla = True
    slots.slots["momentum"].assign([[1.0, 2.0], [3.0, 4.0]])
    return slots


def _mask(permitted: int) -> np.ndarray:
    return np.arange(8) < permitted


def test_growable_slots_grow_to_a_row_per_permitted_row():
    slots = _slots(fixed_capacity=False)
    slots.reserve(_mask(5))
    assert int(slots.capacity()) >= 5
    momentum = slots.slots["momentum"].numpy()
    assert momentum[:2].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert np.all(momentum[2:] == 0.0) and np.all(slots.slots["velocity"].numpy()[2:] == 0.5)


def test_fixed_capacity_slots_keep_their_shape_and_warn_of_the_skipped_rows():
    slots = _slots(fixed_capacity=True)
    with pytest.warns(
        UserWarning, match=r"fixed capacity hold 2 rows.*needs 5.*slot_capacity >= 5"
    ):
        slots.reserve(_mask(5))
    assert int(slots.capacity()) == 2
    assert slots.slots["momentum"].numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert slots.slots["momentum"].shape.as_list() == [2, 2]


def test_fixed_capacity_slots_with_room_say_nothing(recwarn):
    slots = _slots(fixed_capacity=True)
    slots.reserve(_mask(2))
    assert int(slots.capacity()) == 2
    assert not [w for w in recwarn if "fixed capacity" in str(w.message)]
