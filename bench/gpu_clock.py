"""The GPU's SM clock and board power while a benchmark runs, sampled through NVML.

An H200 under a long tensor-core load reaches its board power limit within tens of
milliseconds and lowers its SM clock to stay under it (docs/performance.md, section 7), so a
TFLOP/s figure means little without the clock it ran at. ClockMonitor samples, from a thread,
the SM clock, the board power (NVML's instant reading where the driver has it, which varies
widely from sample to sample under a capped load; its 1-s average otherwise) and the reasons
NVML gives for a lowered clock; summary() gives medians and the fraction of samples in which the
power cap held the clock down.

NVML is the driver's own library (libnvidia-ml.so.1), called through ctypes: no Python package
is needed. Where it cannot be loaded the monitor says so once and its summaries are None.

    with ClockMonitor() as clock:
        run_the_kernel()
    print(describe(clock.summary()))  # 1605 MHz (min 1410), power-capped 96 % of 40 samples, ...
"""
import ctypes
import statistics
import sys
import threading
import time

_NVML_CLOCK_SM = 1
_NVML_FI_DEV_POWER_INSTANT = 186  # nvmlDeviceGetPowerUsage averages over a second on Hopper
# nvmlClocksEventReasons (formerly "throttle reasons") that lower the clock for power or heat.
_REASON_SW_POWER_CAP = 0x4
_REASON_HW_SLOWDOWN = 0x8
_REASON_SW_THERMAL = 0x20
_REASON_HW_THERMAL = 0x40
_REASON_HW_POWER_BRAKE = 0x80


class _Value(ctypes.Union):
    """nvmlValue_t, in the order of nvmlValueType_t."""
    _fields_ = [("d", ctypes.c_double), ("ui", ctypes.c_uint), ("ul", ctypes.c_ulong),
                ("ull", ctypes.c_ulonglong), ("sll", ctypes.c_longlong), ("si", ctypes.c_int)]


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t."""
    _fields_ = [("field_id", ctypes.c_uint), ("scope_id", ctypes.c_uint),
                ("timestamp", ctypes.c_longlong), ("latency_us", ctypes.c_longlong),
                ("value_type", ctypes.c_int), ("status", ctypes.c_int), ("value", _Value)]


class _Nvml:
    """One device's NVML handle, or unavailable (with the reason)."""

    def __init__(self, bus_id):
        self.error = None
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            self._call("nvmlInit_v2")
            self.device = ctypes.c_void_p()
            if bus_id is not None:
                self._call("nvmlDeviceGetHandleByPciBusId_v2", bus_id.encode(),
                           ctypes.byref(self.device))
            else:
                self._call("nvmlDeviceGetHandleByIndex_v2", 0, ctypes.byref(self.device))
            reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
            self.reasons = reasons or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons
            self.power_limit_w = self._uint("nvmlDeviceGetEnforcedPowerLimit") / 1000
            self.instant_power = self._instant_power_mw() is not None
        except (OSError, AttributeError, RuntimeError) as e:
            self.error = str(e)

    def _call(self, name, *args):
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"{name} returned NVML error {status}")

    def _uint(self, name, *args):
        value = ctypes.c_uint()
        self._call(name, self.device, *args, ctypes.byref(value))
        return value.value

    def _instant_power_mw(self):
        field = _FieldValue(field_id=_NVML_FI_DEV_POWER_INSTANT)
        if self.lib.nvmlDeviceGetFieldValues(self.device, 1, ctypes.byref(field)) != 0:
            return None
        if field.status != 0 or not 0 <= field.value_type < len(_Value._fields_):
            return None
        return getattr(field.value, _Value._fields_[field.value_type][0])

    def sample(self):
        """(SM clock in MHz, board power in W, clock-event reason bits)."""
        reasons = ctypes.c_ulonglong()
        if self.reasons(self.device, ctypes.byref(reasons)) != 0:
            raise RuntimeError("reading the clock-event reasons failed")
        power_mw = self._instant_power_mw() if self.instant_power else None
        if power_mw is None:  # no instant field, or this read of it failed
            power_mw = self._uint("nvmlDeviceGetPowerUsage")
        return (self._uint("nvmlDeviceGetClockInfo", _NVML_CLOCK_SM), power_mw / 1000,
                reasons.value)


def _current_bus_id():
    """The current CUDA device's PCI bus id as NVML spells it, or None (then NVML's device 0)."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if not all(hasattr(props, f) for f in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return None
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


class ClockMonitor:
    """Samples the current CUDA device every interval_s seconds between __enter__ and __exit__."""

    _nvml = None  # one NVML handle for the process, made on first use

    def __init__(self, interval_s=0.005):
        if ClockMonitor._nvml is None:
            ClockMonitor._nvml = _Nvml(_current_bus_id())
            if ClockMonitor._nvml.error:
                print(f"# no SM clock or power figures: NVML unavailable "
                      f"({ClockMonitor._nvml.error})", file=sys.stderr)
        self.interval_s = interval_s
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if not self._nvml.error:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(self._nvml.sample())
            time.sleep(self.interval_s)

    def summary(self):
        """Medians over the samples, or None without NVML or samples."""
        if not self.samples:
            return None
        clocks = [s[0] for s in self.samples]
        power = [s[1] for s in self.samples]

        def share(bits):
            return sum(1 for s in self.samples if s[2] & bits) / len(self.samples)

        return dict(sm_mhz=statistics.median(clocks), sm_mhz_min=min(clocks),
                    power_w=statistics.median(power),
                    power_w_max=max(power), power_limit_w=self._nvml.power_limit_w,
                    power_instant=self._nvml.instant_power,
                    power_capped=share(_REASON_SW_POWER_CAP | _REASON_HW_POWER_BRAKE),
                    thermal_slowdown=share(_REASON_HW_SLOWDOWN | _REASON_SW_THERMAL |
                                           _REASON_HW_THERMAL),
                    samples=len(self.samples))


def describe(summary):
    """One short phrase for a table: clock, how often the power cap held it down, power."""
    if summary is None:
        return "clock n/a"
    kind = "instant" if summary["power_instant"] else "1-s average"
    text = (f"{summary['sm_mhz']:.0f} MHz (min {summary['sm_mhz_min']}), power-capped "
            f"{100 * summary['power_capped']:.0f} % of {summary['samples']} samples, {kind} power "
            f"median {summary['power_w']:.0f} max {summary['power_w_max']:.0f} W "
            f"(limit {summary['power_limit_w']:.0f})")
    if summary["thermal_slowdown"] > 0:
        text += f", thermal slowdown {100 * summary['thermal_slowdown']:.0f} %"
    return text
