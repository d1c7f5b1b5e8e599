-- Recount which groups hold ONE topic's data back, after groups.include/exclude changed at runtime.
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = JSON list of the topic's groups that count now
-- Rebuilds the counted set and every partition's zset of counted offsets from the offsets hash.
-- Returns every partition of the topic (each one's minimum may have changed).
local base = KEYS[1]
local counting = {}
for _, g in ipairs(cjson.decode(ARGV[1])) do counting[g] = true end
local parts = redis.call('SMEMBERS', base .. ':parts')
for _, n in ipairs(parts) do redis.call('DEL', base .. ':cz:' .. n) end
redis.call('DEL', base .. ':counted')
local off = redis.call('HGETALL', base .. ':off')
for i = 1, #off, 2 do
  local n, g = string.match(off[i], '^(%d+)|(.*)$')
  if counting[g] then
    redis.call('ZADD', base .. ':cz:' .. n, off[i + 1], g)
    redis.call('SADD', base .. ':counted', g)
  end
end
-- groups assigned to the topic without an offset on it count as well (they hold every partition back)
for g, _ in pairs(counting) do
  if redis.call('SISMEMBER', base .. ':asg', g) == 1 then redis.call('SADD', base .. ':counted', g) end
end
return parts
