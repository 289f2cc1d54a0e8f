"""Frontends turn model files or in-memory framework models into verified qcc Models."""
