"""What the stand-in adds that is not an upstream module: simulated processes
(``process``) and the deterministic toy model (``toy_model``)."""
