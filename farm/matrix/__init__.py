"""Stage 1: the upstream index scraped into the PCWM, the grid derived from it, and the watch."""
