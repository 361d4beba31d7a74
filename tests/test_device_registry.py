"""The device registry (`tgc.backends.get_device`): one instance per device name, also under threads."""

from __future__ import annotations

import threading
import time

import pytest

import tgc.backends as b
from tgc.errors import TgcError


class _SlowDevice:
    """A device whose constructor takes a while (as REMOTE's, which opens a session on its server)."""

    made = 0

    def __init__(self, idx: int):
        time.sleep(0.05)  # (long enough for every thread to reach the constructor without the lock)
        type(self).made += 1
        self.idx = idx


class _BrokenDevice:
    def __init__(self, idx: int):
        raise TgcError("no such thing here")


@pytest.fixture
def fake_kinds(monkeypatch):
    monkeypatch.setitem(b.BUILTIN, "SLOWFAKE", "x:SlowFake")
    monkeypatch.setitem(b.BUILTIN, "BROKENFAKE", "x:BrokenFake")
    real = b.device_class
    monkeypatch.setattr(b, "device_class", lambda kind: {"SLOWFAKE": _SlowDevice, "BROKENFAKE": _BrokenDevice}
                        .get(kind) or real(kind))
    _SlowDevice.made = 0
    yield
    for key in [k for k in b._instances if k[0].endswith("FAKE")]:
        del b._instances[key]


def test_threads_asking_at_once_get_one_instance(fake_kinds):
    got: list[object] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        got.append(b.get_device("slowfake"))

    ts = [threading.Thread(target=ask) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(got) == 8 and all(d is got[0] for d in got)
    assert _SlowDevice.made == 1
    assert b.get_device("SLOWFAKE:0") is got[0]
    other = b.get_device("SLOWFAKE:1")  # another name: another instance
    assert other is not got[0] and other.idx == 1 and _SlowDevice.made == 2


def test_a_failing_constructor_is_raised_each_time_and_caches_nothing(fake_kinds):
    for _ in range(2):
        with pytest.raises(TgcError, match="no such thing"):
            b.get_device("BROKENFAKE")
    assert ("BROKENFAKE", 0) not in b._instances
    with pytest.raises(TgcError, match="no such thing"):  # an index of a kind that does not work: its own error
        b.get_device("BROKENFAKE:1")
