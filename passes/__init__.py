"""qcc's built-in passes (installed as qcc.passes): one module per pass."""
