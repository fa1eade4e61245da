"""The launcher's port picks: below the kernel's ephemeral range, and never the same port twice in a stack."""

from __future__ import annotations

import random

import pytest

from services.launcher.stack import _ephemeral_low, _Ports, free_port

pytestmark = pytest.mark.unit


def test_free_port_skips_what_it_is_told_to_avoid() -> None:
    first = free_port("127.0.0.1", random.Random(3))
    again = free_port("127.0.0.1", random.Random(3), avoid={first})
    assert first != again
    assert 10_000 <= min(first, again) and max(first, again) < _ephemeral_low()


def test_a_stack_never_hands_out_one_port_twice() -> None:
    picker = _Ports("127.0.0.1")
    picks = [picker.take() for _ in range(300)]
    assert len(set(picks)) == len(picks)
    assert picker.take(8000) == 8000  # a configured port is used as given
