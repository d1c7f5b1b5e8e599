-- Move ONE topic's partition state written before the packed layout (part.lua) into it; a no-op once done.
-- KEYS[1] = "<prefix>:{<topic>}". Returns how many partitions were moved.
local base = KEYS[1]
--! include part.lua
return migrate_parts()
