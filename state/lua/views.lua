-- Read the views of many partitions of one topic in one call, packed (issue 17: the per-partition commands of a
-- pipeline cost more to pack and parse in the client than Redis spends serving them).
-- KEYS[1] = the topic's base key (<prefix>:{<topic>}); ARGV = partition numbers.
-- Returns one MessagePack blob: [counted groups, [[n, cleaned, log_start, lowest, zcard, "base:end:ts:size:closed" ...],
-- ...]] in the order of ARGV; cleaned, log_start and lowest are false where there is none.
local base = KEYS[1]
local counted = redis.call('SCARD', base .. ':counted')
local out = {}
for i, n in ipairs(ARGV) do
  local row = {tonumber(n), false, false, false, 0}
  local h = redis.call('HGETALL', base .. ':p:' .. n)
  for j = 1, #h, 2 do
    if h[j] == 'cleaned' then row[2] = tonumber(h[j + 1]) elseif h[j] == 'log_start' then row[3] = tonumber(h[j + 1]) end
  end
  local cz = base .. ':cz:' .. n
  local lowest = redis.call('ZRANGE', cz, 0, 0, 'WITHSCORES')
  if #lowest > 0 then row[4] = tonumber(lowest[2]) end
  row[5] = redis.call('ZCARD', cz)
  local segs = redis.call('ZRANGE', base .. ':seg:' .. n, 0, -1)
  for _, s in ipairs(segs) do row[#row + 1] = s end
  out[i] = row
end
return cmsgpack.pack({counted, out})
