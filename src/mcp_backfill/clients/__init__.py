"""`mcp-backfill clients`: find the MCP client configurations on this machine and wrap their servers.

Separate from the proxy: nothing under `mcp_backfill.clients` is imported when the proxy runs, so its
format libraries (tomlkit) cost the proxy's startup nothing. Modules, one concept each:

- `platforms`: the directories a client's config lives under, per operating system.
- `catalog`: the clients, where each keeps its configs and under which key its servers are.
- `jsonc`: a JSON-with-comments parser that remembers where every value is in the text.
- `jsonc_edit`: rewrites a JSON(C) text into a new value, touching only what changed.
- `toml_file`: the same for Codex's TOML, through tomlkit.
- `documents`: one config file: read, its server tables, rendered back after a change.
- `entries`: the pure part: what a server entry is, wrapping it and undoing that.
- `listing`: what `list` prints.
- `changes`: changed entries into their files: diffs, backups, atomic writes.
- `command`: the command line (`list`, `wrap`, `unwrap`) and how a wrapped entry starts the proxy.
"""
