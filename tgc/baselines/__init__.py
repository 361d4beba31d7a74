"""Baselines tgc is measured against (`tgc bench --vs numpy`, `make bench`): not part of the compiler.

Only the command line and the benchmarks import this package; nothing under `tgc.ir`, `tgc.dsl`, `tgc.engine`,
`tgc.codegen`, `tgc.backends` or `tgc.api` may (a test checks it).
"""
