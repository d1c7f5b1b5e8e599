-- Recount which groups hold ONE topic's data back, after groups.include/exclude changed at runtime.
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = JSON list of the topic's groups that count now; ARGV[2] = JSON list of the groups.required (they count
-- with no offset on the topic too: a counted group without one makes every partition's minimum unknown)
-- Rebuilds the counted set (the reads derive each partition's minimum from it: counted.lua). Returns every partition
-- of the topic (each one's minimum may have changed).
local base = KEYS[1]
local touched = {}
--! include offsets.lua

local parts = redis.call('SMEMBERS', base .. ':parts')
redis.call('DEL', base .. ':counted')
for _, g in ipairs(cjson.decode(ARGV[1])) do
  local id = redis.call('HGET', base .. ':gid', g)
  if id and tonumber(redis.call('HGET', base .. ':oc', id) or '0') > 0 then redis.call('SADD', base .. ':counted', g) end
  -- groups assigned to the topic without an offset on it count as well (they hold every partition back)
  if redis.call('SISMEMBER', base .. ':asg', g) == 1 then redis.call('SADD', base .. ':counted', g) end
end
for _, g in ipairs(cjson.decode(ARGV[2] or '[]')) do redis.call('SADD', base .. ':counted', g) end
return parts
