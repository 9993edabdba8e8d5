"""Benchmarks and experiments; they write their numbers to docs/BENCHMARKS.md.

* :mod:`~hetpart.experiments.tracking` - tracked runs (TensorBoard, wandb offline, null) for every
  training and benchmark; :mod:`~hetpart.experiments.dashboard` - TensorBoard over them.
* :mod:`~hetpart.experiments.bench` / :mod:`~hetpart.experiments.suite` - ``hetpart bench``.
* :mod:`~hetpart.experiments.scaling` - planners as clusters grow; ``bench_*`` - simulator, engine,
  runtime, search benchmarks; :mod:`~hetpart.experiments.run_all` + :mod:`~hetpart.experiments.benchdoc`
  - ``make bench`` and the blocks of docs/BENCHMARKS.md.
"""
