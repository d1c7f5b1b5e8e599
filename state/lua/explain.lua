-- Read-only: what `compactd explain` needs of a chunk of ONE topic's partitions, as one JSON string (redis-py parses
-- many small replies far more slowly than Redis makes them: one string per chunk keeps 100k partitions in seconds).
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = how many of the lowest counted groups to return per partition; ARGV[2..] = partitions
-- Returns JSON [counted groups, [[cleaned/log_start as a flat list of strings, segments, counted offsets, lowest ids with scores as a flat
-- list, every counted id when the minimum is unknown (else false)], ...]] (merge.lua describes the layout).
local base = KEYS[1]
--! include part.lua
local lowest = tonumber(ARGV[1])
local counted = redis.call('SCARD', base .. ':counted')
local out = {}
for i = 2, #ARGV do
  local n = ARGV[i]
  local cz = base .. ':cz:' .. n
  local zcard = redis.call('ZCARD', cz)
  local ids = false
  if counted > 0 and zcard < counted then ids = redis.call('ZRANGE', cz, 0, -1) end
  local r = read_part(n)
  local h, segs = {}, {}
  if r.cleaned >= 0 then h[#h + 1], h[#h + 2] = 'cleaned', string.format('%d', r.cleaned) end
  if r.found then h[#h + 1], h[#h + 2] = 'log_start', string.format('%d', r.log_start) end
  for _, s in ipairs(r.segs) do segs[#segs + 1] = seg_string(s) end
  out[#out + 1] = {
    h,
    segs,
    zcard,
    redis.call('ZRANGE', cz, 0, lowest - 1, 'WITHSCORES'),
    ids,
  }
end
return cjson.encode({counted, out})
