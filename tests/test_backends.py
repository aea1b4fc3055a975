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
    # a read of the whole buffer, which it leaves as it was (no dirty lines for the timed call)
    assert backend._flush_buffer.numel() == 256 and float(backend._flush_sink) == 256.0
    backend._flush_sink.zero_()
    backend._flush_buffer[:3] = 0.0
    backend.flush(dirty=True)  # a write pass: the buffer is filled again, nothing read
    assert bool((backend._flush_buffer == 1).all()) and float(backend._flush_sink) == 0.0


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
        self.covers = []

    def synchronize(self):
        self.log.append("sync")

    def flush(self, dirty=False):
        self.log.append("flush dirty" if dirty else "flush")

    def hold(self, dirty=False, cover_s=0.0):
        self.log.append("hold dirty" if dirty else "hold")
        self.covers.append(cover_s)

    def timer(self):
        def measure(fn):
            self.log.append("start")
            fn()
            self.log.append("end")
            return 1.0
        return measure


def test_each_timed_call_follows_a_flush_and_a_hold():
    from opgen.run import bench

    backend = _RecordingBackend()
    times = bench.measure(backend, lambda: backend.log.append("call"), bench.Protocol(warmup=1, repeat=2))
    host = ["call", "sync", "hold", "call", "call", "call", "sync"]  # the call's host work, measured first
    assert times == [1.0, 1.0]
    assert backend.log == ["call", "sync"] + host + ["flush", "hold", "start", "call", "end"] * 2
    backend.log.clear()
    bench.measure(backend, lambda: backend.log.append("call"), bench.Protocol(warmup=0, repeat=1, flush=False, hold=False))
    assert backend.log == ["sync", "start", "call", "end"]
    backend.log.clear()
    bench.measure(backend, lambda: backend.log.append("call"), bench.Protocol(warmup=0, repeat=1, dirty=True))
    assert backend.log == ["sync"] + host + ["flush dirty", "hold dirty", "start", "call", "end"]


def test_the_hold_before_a_timed_call_covers_its_host_work():
    import time

    from opgen.run import bench

    backend = _RecordingBackend()
    bench.measure(backend, lambda: time.sleep(0.004), bench.Protocol(warmup=0, repeat=2))
    # host_overhead's own hold asks for no cover; each timed call's asks for twice the host work
    assert backend.covers[0] == 0.0
    assert backend.covers[1:] == [backend.covers[1]] * 2 and backend.covers[1] >= bench.HOLD_MARGIN * 0.004


def test_side_by_side_keeps_the_protocols_flush():
    from opgen.run import bench

    backend = _RecordingBackend()
    bench.side_by_side(backend, {"a": lambda: None}, rounds=2, protocol=bench.Protocol(warmup=2, repeat=4, dirty=True))
    # two rounds of max(3, 4 // 2) repeats (bench.per_round), each after a writing flush
    assert backend.log.count("flush dirty") == 6 and "flush" not in backend.log


def test_host_overhead_queues_the_calls_behind_a_held_device():
    from opgen.run import bench

    backend = _RecordingBackend()
    seconds = bench.host_overhead(backend, lambda: backend.log.append("call"), calls=3)
    assert backend.log == ["call", "sync", "hold", "call", "call", "call", "sync"]
    assert seconds >= 0.0


def test_hold_queues_more_passes_over_the_flush_buffer():
    passes = []

    class _Counting(_FakeBackend):
        def _pass(self, write):
            passes.append(write)

    _Counting("cpu").hold()
    _Counting("cpu").hold(dirty=True)
    n = _FakeBackend.HOLD_PASSES
    assert n >= 2 and passes == [False] * n + [True] * n


def test_a_hold_that_must_cover_more_host_work_passes_more_often():
    passes = []

    class _Timed(_FakeBackend):
        def _pass(self, write):
            passes.append(write)
            _FakeEvent.clock += 0.05  # each pass: 0.05 ms of device work

    backend = _Timed("cpu")
    backend.hold(dirty=True, cover_s=0.00039)  # 0.39 ms: 8 passes, after the 2 that timed one pass
    assert passes == [False, False] + [True] * 8
    passes.clear()
    backend.hold(cover_s=0.0001)  # 0.1 ms: the fixed passes cover it; the pass is timed once
    assert passes == [False] * _FakeBackend.HOLD_PASSES
