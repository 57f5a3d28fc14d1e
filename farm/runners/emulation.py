"""Emulated builds: an aarch64 cell on an x86_64 host runs under QEMU user emulation (design.md §8.4).

Every instruction of the compiler is translated, so an emulated cell costs several
native ones (`make bench` measures the ratio: EMULATION_FACTOR) and gets its own, lower
concurrency cap: `FARM_EMULATED_JOBS` (default 1) cells at a time, whatever the native cap is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from farm import settings
from farm.errors import BadInput
from farm.platforms import cell_arch

DEFAULT_EMULATED_JOBS = 1
# How many times longer an emulated compile takes than the native one: `make bench` measured 8.3 for
# the demo cell's (1237 s under qemu against 148.5 s native, README), rounded up. A recipe's timeout,
# set from a native build, is stretched by it for an emulated cell (farm/build/stall.py).
EMULATION_FACTOR = 9


def emulated_concurrency(environ: Mapping[str, str] | None = None) -> int:
    """How many emulated cells may build at once (a positive integer; default 1)."""
    environ = os.environ if environ is None else environ
    raw = (settings.EMULATED_JOBS.get(environ) or "").strip()
    if not raw:
        return DEFAULT_EMULATED_JOBS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise BadInput("environment", settings.EMULATED_JOBS.name, raw, "must be a whole number of at least 1")
    return value


def is_emulated(platform: str, host_arch: str | None = None) -> bool:
    """True when a cell of `platform` (farm spelling) would run under emulation on this host."""
    if platform == "windows":
        return False
    if host_arch is None:
        from farm.platforms import host_arch as _host_arch

        host_arch = _host_arch()
    return cell_arch(platform) != host_arch


# ----- what an emulated aarch64 process sees of the CPU ------------------------------------
#
# qemu-user (Debian 12's 7.2) passes the HOST's /proc/cpuinfo and /sys/devices/system/cpu
# through to the guest. torch's CPU detection (pytorch/cpuinfo, oneDNN's xbyak_aarch64)
# parses them as ARM files and `import torch` dies with SIGSEGV ("Can't open MIDR_EL1
# sysfs entry" first). The container runner therefore mounts an ARM description over
# both, read-only: a Neoverse N1 (r3p1) per host CPU, claiming only baseline Armv8.2
# features, which qemu's default CPU provides.

_N1_MIDR = 0x413FD0C1
_N1_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
_N1_CACHES = (("1", "Data", "64K"), ("1", "Instruction", "64K"), ("2", "Unified", "1024K"),
              ("3", "Unified", "32768K"))
FAKE_CPU_VERSION = 1


def arm_cpuinfo(cpus: int) -> str:
    """/proc/cpuinfo as an arm64 kernel writes it, for `cpus` Neoverse N1 cores."""
    block = ("processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: " + _N1_FEATURES + "\n"
             f"CPU implementer\t: 0x{_N1_MIDR >> 24:02x}\nCPU architecture: 8\n"
             f"CPU variant\t: 0x{(_N1_MIDR >> 20) & 0xF:x}\nCPU part\t: 0x{(_N1_MIDR >> 4) & 0xFFF:03x}\n"
             f"CPU revision\t: {_N1_MIDR & 0xF}\n\n")
    return "".join(block.format(n=n) for n in range(cpus))


def arm_sys_cpu_files(cpus: int) -> dict[str, str]:
    """Relative path -> content of a /sys/devices/system/cpu tree for the same cores."""
    last = f"0-{cpus - 1}" if cpus > 1 else "0"
    files = {"online": last, "possible": last, "present": last}
    for n in range(cpus):
        d = f"cpu{n}"
        files[f"{d}/online"] = "1"
        files[f"{d}/regs/identification/midr_el1"] = f"0x{_N1_MIDR:016x}"
        files[f"{d}/regs/identification/revidr_el1"] = f"0x{0:016x}"
        files[f"{d}/topology/core_id"] = str(n)
        files[f"{d}/topology/physical_package_id"] = "0"
        files[f"{d}/topology/thread_siblings_list"] = str(n)
        files[f"{d}/topology/core_siblings_list"] = last
        for i, (level, kind, size) in enumerate(_N1_CACHES):
            files[f"{d}/cache/index{i}/level"] = level
            files[f"{d}/cache/index{i}/type"] = kind
            files[f"{d}/cache/index{i}/size"] = size
            files[f"{d}/cache/index{i}/coherency_line_size"] = "64"
            files[f"{d}/cache/index{i}/shared_cpu_list"] = last if level == "3" else str(n)
    return {k: v + "\n" for k, v in files.items()}


def fake_arm_cpu(root: Path | str, cpus: int | None = None) -> list[tuple[Path, str]]:
    """Write (once) the fake /proc/cpuinfo and sys cpu tree under `root`; return [(host path, target)]."""
    import shutil
    import tempfile

    cpus = cpus or os.cpu_count() or 1
    root = Path(root)
    dest = root / f"arm-cpu-v{FAKE_CPU_VERSION}-{cpus}"
    if not (dest / ".ok").exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".arm-cpu-", dir=root))
        (tmp / "cpuinfo").write_text(arm_cpuinfo(cpus))
        for rel, text in arm_sys_cpu_files(cpus).items():
            (tmp / "sys-cpu" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "sys-cpu" / rel).write_text(text)
        (tmp / ".ok").write_text("")
        try:
            os.replace(tmp, dest)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return [(dest / "cpuinfo", "/proc/cpuinfo"), (dest / "sys-cpu", "/sys/devices/system/cpu")]
