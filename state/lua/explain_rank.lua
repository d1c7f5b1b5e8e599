-- Read-only: the numbers `compactd explain TOPIC` ranks a chunk of ONE topic's partitions by, as one string of
-- integers. numpy parses it in C (state/redis_store.py `partition_numbers`); the same numbers as JSON or as Redis
-- replies cost Python seconds per 100k partitions to parse, which is what kept `explain TOPIC` slow.
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = the partitions, space-separated (one argument: packing 2,000 arguments costs the client more than this)
-- Returns "<counted groups>", then 5 numbers per partition in ARGV[1]'s order: cleaned up to (-1: never cleaned),
-- log start, counted groups with an offset here (cz's size), the lowest of their offsets (-1: none), closed segments;
-- then those segments, partition after partition, by base offset, 5 numbers each: base, end, first batch max
-- timestamp, size, closed at (the partition's record, part.lua; written with %d: digits only).
-- Three reads per partition are most of the time this takes; the rest builds the string.
local base = KEYS[1]
--! include part.lua
local head, segs, k, m = {redis.call('SCARD', base .. ':counted')}, {}, 1, 0
local fmt = string.format
for n in string.gmatch(ARGV[1], '%d+') do
  local r = read_part(n)
  local cz = base .. ':cz:' .. n
  local low = redis.call('ZRANGE', cz, 0, 0, 'WITHSCORES')
  head[k + 1] = fmt('%d', r.cleaned)
  head[k + 2] = fmt('%d', r.log_start)
  head[k + 3] = redis.call('ZCARD', cz)
  head[k + 4] = low[2] or '-1'  -- a score: Redis prints integral doubles below 2^53 with every digit
  head[k + 5] = #r.segs
  k = k + 5
  for _, s in ipairs(r.segs) do
    m = m + 1
    segs[m] = fmt('%d %d %d %d %d', s[1], s[2], s[3], s[4], s[5])
  end
end
return table.concat(head, ' ') .. ' ' .. table.concat(segs, ' ')
