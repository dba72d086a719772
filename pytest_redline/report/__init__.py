"""What the gate tells people, one module per output, each reading the verdict
(:class:`pytest_redline.verdict.GridVerdict`) and the report document; no renderer imports another.

- :mod:`~pytest_redline.report.terminal`: the terminal summary;
- :mod:`~pytest_redline.report.document`: the report document, ``--redline-json``;
- :mod:`~pytest_redline.report.outcome_csv`: the outcome CSV, ``--redline-outcomes``;
- :mod:`~pytest_redline.report.review`: the HTML review page, ``--redline-html``, with its SVG
  :mod:`~pytest_redline.report.charts`;
- :mod:`~pytest_redline.report.summary`: the Markdown summary, ``--redline-markdown``;
- :mod:`~pytest_redline.report.redline_table`: a certification's text table (``redline certify``);
- shared: :mod:`~pytest_redline.report.sentences` (the verdict's words), :mod:`~pytest_redline.report.text`
  (table and number formatting) and :mod:`~pytest_redline.report.files` (atomic writes, checks,
  hashes, provenance).
"""
