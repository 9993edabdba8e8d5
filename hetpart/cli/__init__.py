"""The command line (``hetpart``). It sits on top of every part and nothing imports it; each
command imports what it needs lazily so that ``hetpart --help`` stays fast."""
