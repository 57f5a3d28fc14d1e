"""Stage 2: arch lists per cell, what they cover, and reading what a binary carries."""
