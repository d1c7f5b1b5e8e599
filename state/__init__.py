"""Redis as the system of record: what the controller and the sinks may call (`protocols`), one mixin per kind of data
stored, the Lua scripts, every Redis key, what one batch changes."""
