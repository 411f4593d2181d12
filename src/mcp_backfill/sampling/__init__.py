"""Answering `sampling/createMessage`: validation, MCP<->Claude conversion, model choice."""
