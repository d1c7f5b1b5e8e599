-- Read-only: the numbers `compactd explain TOPIC` ranks a chunk of ONE topic's partitions by, as one string of
-- integers. numpy parses it in C (state/redis_store.py `partition_numbers`); the same numbers as JSON or as Redis
-- replies cost Python seconds per 100k partitions to parse, which is what kept `explain TOPIC` slow.
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = the partitions, space-separated (one argument: packing 2,000 arguments costs the client more than this)
-- Returns "<counted groups>", then 5 numbers per partition in ARGV[1]'s order: cleaned up to (-1: never cleaned),
-- log start, counted groups with an offset here (cz's size), the lowest of their offsets (-1: none), closed segments;
-- then those segments, partition after partition, by base offset, 5 numbers each: base, end, first batch max
-- timestamp, size, closed at (seg:<n>'s members, written by merge.lua with %d: digits only).
-- Four reads per partition are most of the time this takes (~15 µs a partition); the rest builds the string.
local base = KEYS[1]
local head, segs, k, m = {redis.call('SCARD', base .. ':counted')}, {}, 1, 0
for n in string.gmatch(ARGV[1], '%d+') do
  local h = redis.call('HMGET', base .. ':p:' .. n, 'cleaned', 'log_start')
  local cz = base .. ':cz:' .. n
  local low = redis.call('ZRANGE', cz, 0, 0, 'WITHSCORES')
  local members = redis.call('ZRANGE', base .. ':seg:' .. n, 0, -1)
  head[k + 1] = h[1] or '-1'
  head[k + 2] = h[2] or '0'
  head[k + 3] = redis.call('ZCARD', cz)
  head[k + 4] = low[2] or '-1'  -- a score: Redis prints integral doubles below 2^53 with every digit
  head[k + 5] = #members
  k = k + 5
  if #members > 0 then
    m = m + 1
    segs[m] = table.concat(members, ' ')
  end
end
local packed = string.gsub(table.concat(segs, ' '), ':', ' ')
return table.concat(head, ' ') .. ' ' .. packed
