-- Read the views of many partitions of one topic in one call, packed (issue 17: the per-partition commands of a
-- pipeline cost more to pack and parse in the client than Redis spends serving them).
-- KEYS[1] = the topic's base key (<prefix>:{<topic>}); ARGV = partition numbers.
-- Returns one MessagePack blob: [counted groups, [[n, cleaned, log_start, lowest counted offset, counted groups with
-- an offset here, cleaned at, "base:end:ts:size:closed" ...], ...]] in the order of ARGV; cleaned, log_start, lowest
-- and cleaned at are false where there is none; then every replica's own log (replicas.lua `replica_cleans`, 6
-- numbers a replica, where agents report replicas)].
local base = KEYS[1]
--! include part.lua
--! include counted.lua
--! include replicas.lua
local counted, ids = counted_ids()
local count, lowest = counted_lowest(ids, ARGV)
local out = {}
for i, n in ipairs(ARGV) do
  local row = {tonumber(n), false, false, lowest[n] or false, count[n] or 0, false}
  local r = read_part(n)
  if r.cleaned >= 0 then row[2] = r.cleaned end
  if r.cleaned_at then row[6] = r.cleaned_at end
  if r.found then row[3] = r.log_start end
  for _, s in ipairs(r.segs) do row[#row + 1] = seg_string(s) end
  out[i] = row
end
return cmsgpack.pack({counted, out, replica_cleans(ARGV, true)})
