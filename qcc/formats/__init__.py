"""File formats shared by frontends and backends (nnabla function names, ...)."""
