"""Thin adapters that move whole JSON-RPC messages between a peer and the relay."""
