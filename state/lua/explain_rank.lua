-- Read-only: the numbers a chunk of ONE topic's partitions is ranked by (`compactd explain TOPIC`) and evaluated in
-- bulk by (the controller, policy/bulk.py), as one MessagePack array of integers (state/redis_store.py
-- `partition_numbers`); the same numbers as Redis replies cost Python seconds per 100k partitions to parse.
-- KEYS[1] = "<prefix>:{<topic>}" (every key below shares its hash tag: one Cluster slot)
-- ARGV[1] = the partitions, space-separated (one argument: packing 2,000 arguments costs the client more than this)
-- Returns [counted groups, then 6 numbers per partition in ARGV[1]'s order: cleaned up to (-1: never cleaned),
-- log start, counted groups with an offset here, the lowest of their offsets (-1: none), closed segments, when the
-- last clean was seen (-1: unknown);
-- then those segments, partition after partition, by base offset, 5 numbers each: base, end, first batch max
-- timestamp, size, closed at (the partition's record, part.lua); then how many replicas the agents report for these
-- partitions, and 5 numbers each (replicas.lua `replica_cleans`)]. Integers are exact up to 2^53.
-- The records are read with one HMGET per bucket, the counted offsets with one per (counted group, bucket).
local base = KEYS[1]
--! include part.lua
--! include counted.lua
--! include replicas.lua
local counted, ids = counted_ids()
local head, segs, k, m = {counted}, {}, 1, 0
local ns = {}
for n in string.gmatch(ARGV[1], '%d+') do ns[#ns + 1] = n end
local records = read_parts(ns)
local count, lowest = counted_lowest(ids, ns)
for _, n in ipairs(ns) do
  local r = records[n]
  head[k + 1] = r.cleaned
  head[k + 2] = r.log_start
  head[k + 3] = count[n] or 0
  head[k + 4] = lowest[n] or -1
  head[k + 5] = #r.segs
  head[k + 6] = r.cleaned_at or -1
  k = k + 6
  for _, s in ipairs(r.segs) do
    segs[m + 1], segs[m + 2], segs[m + 3], segs[m + 4], segs[m + 5] = s[1], s[2], s[3], s[4], s[5]
    m = m + 5
  end
end
for i = 1, m do head[k + i] = segs[i] end
k = k + m
local reps = replica_cleans(ns, false)
head[k + 1] = #reps / 5
for i = 1, #reps do head[k + 1 + i] = reps[i] end
return cmsgpack.pack(head)
