"""The command line: `cli` parses every command and hands each to the module that does it (`compact_cli`,
`config_cli`, `explain_cli`, `status`, `progress`; the daemon, the agents and the demo in their own folders), with the
operator's tools beside it (`acls` for `doctor`, `config_doc`, `module_map`) and `compactd/settings.py`, the
configuration every command reads, beside the shared types."""
