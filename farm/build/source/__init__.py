"""Build step 1, source (design.md §6): fetch, verify, copy to a per-cell work dir, patch.

Three kinds of source, each cached by its pin under cache_dir()/sources:

- git:   a bare mirror per URL (sources/git/), a partial clone, blobs fetched per commit (git.py);
- sdist: the archive per sha256 (sources/sdist/<sha256>/), a PyPI `name==version` resolved
         through the index, checked before anything is extracted (archive.py);
- path:  a local folder, copied (no cache); its content digest is the pin (local.py).

prepare.py assembles a cell's work dir from the source, the extra sources and the patches
(patches.py); base.py holds what they share (what a fetch returns, the cache folder; the errors are in farm.errors).
Every function takes the loaded recipe's typed values, already checked by the recipe loader:
what is checked here is what fetching finds (design.md §6.1).
"""
