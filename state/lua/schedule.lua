-- Store a chunk of ONE topic's deadlines and compaction-due times in one call (issue 17: a ZADD of 100k members
-- packed by the client took longer than evaluating them).
-- KEYS[1] = the deadlines zset, KEYS[2] = the compaction-due zset (both in the {sched} slot)
-- ARGV[1] = the topic; ARGV[2] = "<partition> <deadline> <due> ..." (-1: none, the member is removed)
local topic = ARGV[1]
local put = {{}, {}}
local drop = {{}, {}}
local function flush(i, force)
  if #put[i] >= 1000 or (force and #put[i] > 0) then
    redis.call('ZADD', KEYS[i], unpack(put[i]))
    put[i] = {}
  end
  if #drop[i] >= 1000 or (force and #drop[i] > 0) then
    redis.call('ZREM', KEYS[i], unpack(drop[i]))
    drop[i] = {}
  end
end
for n, deadline, due in string.gmatch(ARGV[2], '(%d+) (%-?%d+) (%-?%d+)') do
  local member = topic .. '/' .. n
  for i, at in ipairs({deadline, due}) do
    if at == '-1' then
      drop[i][#drop[i] + 1] = member
    else
      put[i][#put[i] + 1] = at
      put[i][#put[i] + 1] = member
    end
    flush(i, false)
  end
end
flush(1, true)
flush(2, true)
return 0
