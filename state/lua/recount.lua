-- Recount which groups hold ONE topic's data back, after groups.include/exclude changed at runtime.
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = JSON list of the topic's groups that count now
-- Rebuilds the counted set and every partition's zset of counted offsets (group ids) from the offset buckets
-- (merge.lua describes the layout). Returns every partition of the topic (each one's minimum may have changed).
local base = KEYS[1]
local touched = {}
--! include offsets.lua

local parts = redis.call('SMEMBERS', base .. ':parts')
for _, n in ipairs(parts) do redis.call('DEL', base .. ':cz:' .. n) end
redis.call('DEL', base .. ':counted')
for _, g in ipairs(cjson.decode(ARGV[1])) do
  local id = redis.call('HGET', base .. ':gid', g)
  if id and tonumber(redis.call('HGET', base .. ':oc', id) or '0') > 0 then
    for b = 0, tonumber(redis.call('HGET', base .. ':ob', id) or '-1') do
      local off = redis.call('HGETALL', base .. ':o:' .. id .. ':' .. b)
      for i = 1, #off, 2 do redis.call('ZADD', base .. ':cz:' .. off[i], off[i + 1], id) end
    end
    redis.call('SADD', base .. ':counted', g)
  end
  -- groups assigned to the topic without an offset on it count as well (they hold every partition back)
  if redis.call('SISMEMBER', base .. ':asg', g) == 1 then redis.call('SADD', base .. ':counted', g) end
end
return parts
