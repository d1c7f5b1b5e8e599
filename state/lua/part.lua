-- A partition's own state, packed (issue 17: the p:<n> hash and seg:<n> zset cost 400 B a partition at 5 segments,
-- most of it per-key overhead). Included where a script says so; the script defines `base`.
-- <base>:ps:<bucket> hashes hold 128 partitions each (listpack, like the offsets); field <n> = MessagePack array
--   [cleaned up to (-1: never), log start, then 5 integers per closed segment, by base offset, delta-encoded:
--    base - previous end (the first: base), end - base, closed at - first batch max timestamp, size,
--    closed at - previous closed at (the first: closed at)]
--   Where the time of the last clean is known (the `compacted` event's ts that moved `cleaned up to`), it follows the
--   array as a second MessagePack value: a build before it reads the array alone (cmsgpack.unpack's first value),
--   so rolling back over it needs no wipe; that build's writes drop the time (unknown again until the next clean).
-- MessagePack keeps small integers in 1-5 bytes; integers are exact up to 2^53 (Lua numbers are doubles).
local PART_BUCKET = 128

local function part_key(n) return base .. ':ps:' .. math.floor(tonumber(n) / PART_BUCKET) end

-- {cleaned = -1 | offset, cleaned_at = nil | epoch ms, log_start = offset,
--  segs = {{base, end, first batch max ts, size, closed at}, ...}, found = whether the partition has a record}
local function decode_part(raw)
  if not raw then return {cleaned = -1, log_start = 0, segs = {}, found = false} end
  local a, cleaned_at = cmsgpack.unpack(raw)
  local segs, prev_end, prev_closed = {}, 0, 0
  for i = 3, #a, 5 do
    local b = prev_end + a[i]
    local e = b + a[i + 1]
    local closed = prev_closed + a[i + 4]
    segs[#segs + 1] = {b, e, closed - a[i + 2], a[i + 3], closed}
    prev_end, prev_closed = e, closed
  end
  return {cleaned = a[1], cleaned_at = cleaned_at, log_start = a[2], segs = segs, found = true}
end

local function read_part(n) return decode_part(redis.call('HGET', part_key(n), tostring(n))) end

-- `items` grouped by key_of(item): key -> its items in their order, and the keys in the order first seen.
local function group_by(items, key_of)
  local groups, order = {}, {}
  for _, x in ipairs(items) do
    local k = key_of(x)
    local g = groups[k]
    if not g then
      g = {}
      groups[k] = g
      order[#order + 1] = k
    end
    g[#g + 1] = x
  end
  return groups, order
end

-- The records of many partitions (a list of numbers as strings), read with one HMGET per bucket: n -> record.
local function read_parts(ns)
  local by_bucket, order = group_by(ns, part_key)
  local out = {}
  for _, k in ipairs(order) do
    local fields = by_bucket[k]
    for i = 1, #fields, 1000 do
      local last = math.min(i + 999, #fields)
      local raws = redis.call('HMGET', k, unpack(fields, i, last))
      for j = i, last do out[fields[j]] = decode_part(raws[j - i + 1] or nil) end
    end
  end
  return out
end

local function encode_part(p)
  local a = {p.cleaned, p.log_start}
  local prev_end, prev_closed = 0, 0
  for _, s in ipairs(p.segs) do
    a[#a + 1] = s[1] - prev_end
    a[#a + 1] = s[2] - s[1]
    a[#a + 1] = s[5] - s[3]
    a[#a + 1] = s[4]
    a[#a + 1] = s[5] - prev_closed
    prev_end, prev_closed = s[2], s[5]
  end
  if p.cleaned_at then return cmsgpack.pack(a, p.cleaned_at) end
  return cmsgpack.pack(a)
end

local function seg_string(s) return string.format('%d:%d:%d:%d:%d', s[1], s[2], s[3], s[4], s[5]) end

-- State written by earlier layouts, moved once per topic and marked in <base>:layout: partitions as a p:<n> hash and a
-- seg:<n> zset of "base:end:ts:size:closed" by base offset ('parts'), and a cz:<n> zset per partition of the counted
-- groups' offsets, now derived from the offset buckets (counted.lua) and deleted ('counted'). Returns how many
-- partitions were moved to the packed record.
local function migrate_parts()
  local done = redis.call('HMGET', base .. ':layout', 'parts', 'counted')
  if done[1] == '2' and done[2] == '1' then return 0 end
  local moved = 0
  local parts = redis.call('SMEMBERS', base .. ':parts')
  if done[1] ~= '2' then
    for _, n in ipairs(parts) do
      local h = redis.call('HGETALL', base .. ':p:' .. n)
      local members = redis.call('ZRANGE', base .. ':seg:' .. n, 0, -1)
      if #h > 0 or #members > 0 then
        local p = {cleaned = -1, log_start = 0, segs = {}}
        for j = 1, #h, 2 do
          if h[j] == 'cleaned' then p.cleaned = tonumber(h[j + 1]) elseif h[j] == 'log_start' then p.log_start = tonumber(h[j + 1]) end
        end
        for _, m in ipairs(members) do
          local b, e, ts, size, closed = string.match(m, '^(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+)$')
          p.segs[#p.segs + 1] = {tonumber(b), tonumber(e), tonumber(ts), tonumber(size), tonumber(closed)}
        end
        redis.call('HSET', part_key(n), n, encode_part(p))
        redis.call('DEL', base .. ':p:' .. n, base .. ':seg:' .. n)
        moved = moved + 1
      end
    end
    redis.call('HSET', base .. ':layout', 'parts', 2)
  end
  if done[2] ~= '1' then
    for i = 1, #parts, 1000 do
      local keys = {}
      for j = i, math.min(i + 999, #parts) do keys[#keys + 1] = base .. ':cz:' .. parts[j] end
      redis.call('DEL', unpack(keys))
    end
    redis.call('HSET', base .. ':layout', 'counted', 1)
  end
  return moved
end
