-- Read-only: the live action records (compact, delete_records) of a chunk of ONE topic's partitions, only where there
-- are some (most partitions have none). Asking the hash for two fields a partition from the client cost more to pack
-- and parse than the evaluation itself (issue 17); here only the partition numbers go in and only records come out.
-- KEYS[1] = the action records hash (<prefix>:{act}:rec); ARGV[1] = the topic; ARGV[2] = partitions, space-separated.
-- When the hash holds fewer records than the fields asked for, it is read whole and filtered instead.
local rec, topic = KEYS[1], ARGV[1]
local out, wanted, asked = {}, {}, 0
for n in string.gmatch(ARGV[2], '%d+') do
  wanted[n] = true
  asked = asked + 2
end
if redis.call('HLEN', rec) < asked then
  local all = redis.call('HGETALL', rec)
  for i = 1, #all, 2 do
    local t, n, kind = string.match(all[i], '^(.*)/(%d+)/([%w_]+)$')
    if t == topic and wanted[n] and (kind == 'compact' or kind == 'delete_records') then out[#out + 1] = all[i + 1] end
  end
  return out
end
local fields = {}
local function flush()
  if #fields > 0 then
    local vals = redis.call('HMGET', rec, unpack(fields))
    for i = 1, #fields do
      if vals[i] then out[#out + 1] = vals[i] end
    end
    fields = {}
  end
end
for n in pairs(wanted) do
  fields[#fields + 1] = topic .. '/' .. n .. '/compact'
  fields[#fields + 1] = topic .. '/' .. n .. '/delete_records'
  if #fields >= 1000 then flush() end
end
flush()
return out
