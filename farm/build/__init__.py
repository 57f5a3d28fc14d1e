"""Stage 4: one cell from source to a verified wheel; the steps and the host side that starts them."""
