"""The verify gate (docs/design.md, design.md §7): no wheel leaves the farm unless it carries exactly what its cell promised.

`expectation` says what a cell promises and holds the report; `wheel` opens the wheel and checks it
as a file; `checks` holds the static checks (name, metadata, binaries, ELF, torch linkage, arches);
`torchenv` reads the cell's torch environment; `importcheck` imports the installed wheel in a child
process; `gate` runs them in order.
"""
