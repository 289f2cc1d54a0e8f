"""File formats and framework conventions shared by frontends and backends (readers, name tables)."""
