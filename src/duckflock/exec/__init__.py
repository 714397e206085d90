"""Running plans on ranks, in layers that import downwards only: ``reports`` (the plain data a run
reports) and ``results`` (result files) at the bottom, then ``resources`` (what a rank owns),
``stages`` (one stage on one rank), ``control`` (one query: the driver, each rank's side, the
messages between them) and ``hosting`` (the processes that run ranks and serve sessions)."""
