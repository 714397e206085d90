"""Session backends: the ways a ``Session`` reaches its ranks, one module each, one protocol
(``base.Backend``). ``session.connect`` picks one."""
