"""Many cells: selection, scheduling, reports, the cache budget, CI and the demo."""
