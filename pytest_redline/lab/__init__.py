"""The paper's analyses on recorded outcomes, apart from the gate.

- :mod:`~pytest_redline.lab.analysis`: budget sweeps, held-out splits, baselines, the
  validity study and bootstrap intervals, vectorized over splits and budgets (one module
  each: ``sweep``, ``heldout``, ``baselines``, ``validity``, ``intervals``, on ``procedure``
  and ``splits``; every name imports from ``analysis``);
- :mod:`~pytest_redline.lab.plots`: their figures (the ``plots`` extra, matplotlib);
- :mod:`~pytest_redline.lab.commands`: the ``redline`` subcommands that run them.

The gate (``pytest --redline-alpha``) never imports this package; ``tests/meta/test_imports.py``
checks it. It builds on the gate's statistics (:mod:`pytest_redline.risk`) and outcome
tables, never the other way round.
"""
