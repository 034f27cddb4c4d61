"""stats.json and sampling.json (``stats``, ``sampling``: alpha-sampling maths), and the corpus
report drawn from them alone (``corpus_report``, ``html``)."""
