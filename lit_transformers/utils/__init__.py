"""Helpers for the entry points: config checks, instantiation, error reporting."""
