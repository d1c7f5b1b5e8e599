-- Store a chunk of ONE topic's deadlines in one call (issue 17: a ZADD of 100k members packed by the client took
-- longer than evaluating them).
-- KEYS[1] = the deadlines zset ({sched} slot)
-- ARGV[1] = the topic; ARGV[2] = "<partition> <deadline> ..." (-1: none, the member is removed)
local topic = ARGV[1]
local put = {}
local drop = {}
local function flush(force)
  if #put >= 2000 or (force and #put > 0) then
    redis.call('ZADD', KEYS[1], unpack(put))
    put = {}
  end
  if #drop >= 1000 or (force and #drop > 0) then
    redis.call('ZREM', KEYS[1], unpack(drop))
    drop = {}
  end
end
for n, at in string.gmatch(ARGV[2], '(%d+) (%-?%d+)') do
  local member = topic .. '/' .. n
  if at == '-1' then
    drop[#drop + 1] = member
  else
    put[#put + 1] = at
    put[#put + 1] = member
  end
  flush(false)
end
flush(true)
return 0
