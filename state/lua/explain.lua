-- Read-only: what `compactd explain` needs of a chunk of ONE topic's partitions, as one JSON string (redis-py parses
-- many small replies far more slowly than Redis makes them: one string per chunk keeps 100k partitions in seconds).
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = how many of the lowest counted groups to return per partition; ARGV[2..] = partitions
-- Returns JSON [counted groups, [[cleaned/cleaned_at/log_start as a flat list of strings, segments, counted groups
-- with an offset here, the lowest ones' ids and offsets as a flat list, every counted id with an offset here when the
-- minimum is unknown (else false)], ...]] (offsets.lua describes the layout).
local base = KEYS[1]
--! include part.lua
--! include counted.lua
local lowest = tonumber(ARGV[1])
local counted, ids = counted_ids()
local ns, offsets = {}, {}
for i = 2, #ARGV do
  ns[#ns + 1] = ARGV[i]
  offsets[ARGV[i]] = {}
end
each_counted_bucket(ids, ns, function(n, v, id) table.insert(offsets[n], {tonumber(v), id}) end)
local out = {}
for _, n in ipairs(ns) do
  local have = offsets[n]
  -- lowest offset first, then by id (the order a zset of ids by offset kept)
  table.sort(have, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local low, positioned = {}, false
  for j = 1, math.min(lowest, #have) do
    low[#low + 1] = have[j][2]
    low[#low + 1] = string.format('%d', have[j][1])  -- a string: cjson writes numbers with 14 digits
  end
  if counted > 0 and #have < counted then
    positioned = {}
    for j, h in ipairs(have) do positioned[j] = h[2] end
  end
  local r = read_part(n)
  local h, segs = {}, {}
  if r.cleaned >= 0 then h[#h + 1], h[#h + 2] = 'cleaned', string.format('%d', r.cleaned) end
  if r.cleaned_at then h[#h + 1], h[#h + 2] = 'cleaned_at', string.format('%d', r.cleaned_at) end
  if r.found then h[#h + 1], h[#h + 2] = 'log_start', string.format('%d', r.log_start) end
  for _, s in ipairs(r.segs) do segs[#segs + 1] = seg_string(s) end
  out[#out + 1] = {h, segs, #have, low, positioned}
end
return cjson.encode({counted, out})
