"""Static HTML pages (no scripts, every string escaped) generated from the farm's data."""
