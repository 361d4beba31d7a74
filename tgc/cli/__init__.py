"""The `tgc` command line: a thin shell over the Python API (`tgc/api.py`).

`main.py` defines the click commands; the helpers they use (input files, output files, `--check`,
bench/beam reports) live in the sibling modules and are imported only by the command that needs them,
so that start-up stays fast.
"""
