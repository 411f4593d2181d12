"""Backends that turn a Claude Messages API request into a Claude message."""
