"""Backends: the registry, and the event timing the device backends share (with a fake device)."""
import pytest

from opgen.backends import EventBackend, get_backend
from opgen.errors import UnsupportedInput


class _FakeEvent:
    clock = 0.0

    def __init__(self, enable_timing):
        assert enable_timing
        self.at = None

    def record(self):
        self.at = _FakeEvent.clock

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.at - self.at


class _FakeDevice:
    Event = _FakeEvent
    synced = []

    @staticmethod
    def synchronize(device):
        _FakeDevice.synced.append(device)


class _FakeBackend(EventBackend):
    name = "fake"
    FLUSH_BYTES = 1024

    def _module(self):
        return _FakeDevice


def test_event_timer_measures_between_records():
    backend = _FakeBackend("cpu")

    def work():
        _FakeEvent.clock += 2.5

    assert backend.timer()(work) == 2.5
    backend.synchronize()
    assert _FakeDevice.synced[-1] == "cpu"
    backend.flush()
    backend.flush()
    assert backend._flush_buffer.numel() == 256 and int(backend._flush_buffer.sum()) == 0


def test_registry():
    assert get_backend("interpreter").name == "interpreter"
    with pytest.raises(UnsupportedInput, match="unknown backend 'tpu'"):
        get_backend("tpu")
