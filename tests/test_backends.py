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


class _RecordingBackend:
    """Logs what the timing protocol asks of a device, in order."""

    name = "recording"
    device = "cpu"

    def __init__(self):
        self.log = []

    def synchronize(self):
        self.log.append("sync")

    def flush(self):
        self.log.append("flush")

    def hold(self):
        self.log.append("hold")

    def timer(self):
        def measure(fn):
            self.log.append("start")
            fn()
            self.log.append("end")
            return 1.0
        return measure


def test_each_timed_call_follows_a_flush_and_a_hold():
    from opgen import bench

    backend = _RecordingBackend()
    times = bench.measure(backend, lambda: backend.log.append("call"), bench.Protocol(warmup=1, repeat=2))
    assert times == [1.0, 1.0]
    assert backend.log == ["call", "sync"] + ["flush", "hold", "start", "call", "end"] * 2
    backend.log.clear()
    bench.measure(backend, lambda: backend.log.append("call"), bench.Protocol(warmup=0, repeat=1, flush=False, hold=False))
    assert backend.log == ["sync", "start", "call", "end"]


def test_host_overhead_queues_the_calls_behind_a_held_device():
    from opgen import bench

    backend = _RecordingBackend()
    seconds = bench.host_overhead(backend, lambda: backend.log.append("call"), calls=3)
    assert backend.log == ["call", "sync", "hold", "call", "call", "call", "sync"]
    assert seconds >= 0.0


def test_hold_queues_more_passes_over_the_flush_buffer():
    backend = _FakeBackend("cpu")
    zeroed = []

    class _Buffer:
        def zero_(self):
            zeroed.append(1)

    backend._flush_buffer = _Buffer()
    backend.hold()
    assert len(zeroed) == _FakeBackend.HOLD_PASSES >= 2
