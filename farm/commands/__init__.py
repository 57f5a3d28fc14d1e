"""Command groups of the `farm` CLI: each parses arguments and calls library functions."""
