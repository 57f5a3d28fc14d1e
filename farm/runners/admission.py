"""Memory admission (design.md §11.2): how many compile jobs a build may run, from its recipe's
`max_jobs x peak_gb_per_job`, the memory free and what one build container may hold. `farm run`'s
scheduler admits each cell against what the running ones reserved; a build that nobody admitted
(`farm build`, a CI row, the demo) admits itself. Arch lists are never trimmed for memory."""

from __future__ import annotations

from farm.platforms import meminfo_gb


def mem_available_gb() -> float:
    """The default budget: MemAvailable now (8 GB where /proc/meminfo has none)."""
    available = meminfo_gb("MemAvailable")
    return 8.0 if available is None else available


def admit_jobs(want: int, peak_gb: float, free_gb: float, anything_running: bool,
               cap_gb: float | None = None) -> tuple[int | None, str | None]:
    """(max_jobs to run with, the clamp's reason) for a cell, or (None, None) to wait (design.md §11.2).
    cap_gb: what one build may hold whatever is free, its container's memory limit (over it the
    kernel kills the compiler)."""
    room, where = free_gb, "GB free of the budget"
    if cap_gb is not None and cap_gb < free_gb:
        room, where = cap_gb, "GB limit of a build container"
    fit = int(room // peak_gb)
    if fit >= want:
        return want, None
    if fit >= 1:
        return fit, f"memory admission: {want} jobs x {peak_gb:g} GB exceed the {room:.1f} {where}; clamped to {fit}"
    if not anything_running or free_gb >= peak_gb:   # waiting would not raise the container's limit
        return 1, f"memory admission: even one job ({peak_gb:g} GB) exceeds the {room:.1f} {where}; building with 1"
    return None, None


def admit_alone(want: int, peak_gb: float, budget_gb: float | None = None,
                cap_gb: float | None = None) -> tuple[int | None, str | None]:
    """Memory admission of a build that runs by itself (`farm build`, a CI row, the demo): (the clamped
    max_jobs, why) when `want` jobs do not fit the budget (default: MemAvailable now) or the cap, else
    (None, None)."""
    budget = mem_available_gb() if budget_gb is None else budget_gb
    jobs, clamp = admit_jobs(want, peak_gb, budget, anything_running=False, cap_gb=cap_gb)
    return (jobs, clamp) if clamp else (None, None)
