"""One benchmark figure: a measurement, its baseline from the same run, and a goal on the ratio."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass
class Figure:
    name: str
    value: float            # seconds (or the unit given)
    baseline: float | None  # the same-run baseline, same unit
    goal: float | None = None   # the ratio must be at most this
    unit: str = "s"
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.value / self.baseline

    @property
    def met(self) -> bool | None:
        return None if self.goal is None or self.ratio is None else self.ratio <= self.goal

    def as_dict(self) -> dict:
        return {**self.__dict__, "ratio": self.ratio, "met": self.met}

    def line(self, width: int) -> str:
        ratio = "" if self.ratio is None else f" ratio {self.ratio:.3f}"
        goal = "" if self.goal is None else f" (goal <= {self.goal}: {'met' if self.met else 'NOT met'})"
        base = "" if self.baseline is None else f" baseline {self.baseline:.4g}{self.unit}"
        return f"{self.name:<{width}}  {self.value:.4g}{self.unit}{base}{ratio}{goal}  {self.note}".rstrip()


def median_time(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
