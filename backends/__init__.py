"""qcc's backends (installed as qcc.backends): one module or package per target."""
