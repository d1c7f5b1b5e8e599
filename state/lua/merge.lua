-- Merge one micro-batch's changes for ONE topic, atomically and at most once per (stream, batch).
-- Every key shares the topic's hash tag (KEYS[1] = "<prefix>:{<topic>}"), so the script stays on
-- one Redis Cluster slot.
-- ARGV[1] = stream id (the Spark query id: stable across restarts of one checkpoint)
-- ARGV[2] = batch id
-- ARGV[3] = JSON payload:
--   gdel     [group, ...]                      groups deleted (all their offsets on this topic go)
--   assign   [[group, assigned(0/1), counted(0/1)], ...]  members assigned to this topic, from group metadata
--   offsets  [[group, partition, offset|-1, counted(0/1)], ...]   -1 = offset deleted
--   compacted [[partition, cleaned_up_to], ...]
--   logstart  [[partition, log_start_offset], ...]
--   segments  [[partition, base, end, first_batch_max_ts, size, closed_at], ...]
-- Returns the touched partitions, or -1 when this batch was already applied (replay).
local base = KEYS[1]
local stream, batch = ARGV[1], tonumber(ARGV[2])
local applied = redis.call('HGET', base .. ':applied', stream)
if applied and tonumber(applied) >= batch then
  return -1
end
local p = cjson.decode(ARGV[3])
local touched = {}
-- Redis turns Lua numbers into strings with %.14g; integers are written with %d to keep every digit.
local function int(x) return string.format('%d', x) end

local function touch(n)
  touched[tostring(n)] = true
  redis.call('SADD', base .. ':parts', n)
end

local function touch_all()
  for _, m in ipairs(redis.call('SMEMBERS', base .. ':parts')) do touched[m] = true end
end

-- A group holds the topic back while it has an offset on it OR members assigned to it: an assigned group
-- that never committed has no position, so the minimum is unknown and consumed retention waits.
local function forget_if_idle(g)
  if redis.call('SCARD', base .. ':gp:' .. g) == 0 and redis.call('SISMEMBER', base .. ':asg', g) == 0 then
    redis.call('SREM', base .. ':groups', g)
    if redis.call('SREM', base .. ':counted', g) == 1 then
      -- the number of counted groups changed: every partition's minimum may now be known/unknown
      touch_all()
    end
  end
end

local function del_offset(g, n)
  n = tostring(n)
  redis.call('HDEL', base .. ':off', n .. '|' .. g)
  redis.call('SREM', base .. ':gp:' .. g, n)
  redis.call('ZREM', base .. ':cz:' .. n, g)
  forget_if_idle(g)
  touched[n] = true
end

for _, g in ipairs(p.gdel or {}) do
  redis.call('SREM', base .. ':asg', g)
  for _, n in ipairs(redis.call('SMEMBERS', base .. ':gp:' .. g)) do del_offset(g, n) end
  forget_if_idle(g)
end

for _, a in ipairs(p.assign or {}) do
  local g, on, counted = a[1], a[2], a[3]
  if on == 1 then
    redis.call('SADD', base .. ':asg', g)
    redis.call('SADD', base .. ':groups', g)
    if counted == 1 and redis.call('SADD', base .. ':counted', g) == 1 then touch_all() end
  else
    redis.call('SREM', base .. ':asg', g)
    forget_if_idle(g)
  end
end

for _, o in ipairs(p.offsets or {}) do
  local g, n, off, counted = o[1], tostring(o[2]), o[3], o[4]
  if off < 0 then
    del_offset(g, n)
  else
    redis.call('HSET', base .. ':off', n .. '|' .. g, int(off))
    redis.call('SADD', base .. ':gp:' .. g, n)
    redis.call('SADD', base .. ':groups', g)
    if counted == 1 then
      redis.call('ZADD', base .. ':cz:' .. n, int(off), g)
      if redis.call('SADD', base .. ':counted', g) == 1 then
        for _, m in ipairs(redis.call('SMEMBERS', base .. ':parts')) do touched[m] = true end
      end
    end
    touch(n)
  end
end

for _, c in ipairs(p.compacted or {}) do
  local key = base .. ':p:' .. c[1]
  local old = tonumber(redis.call('HGET', key, 'cleaned') or '-1')
  if c[2] > old then redis.call('HSET', key, 'cleaned', int(c[2])) end
  touch(c[1])
end

local function prune(n, ls)
  -- drop segments wholly below the log start: they are gone from disk
  local zkey = base .. ':seg:' .. n
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', zkey, '-inf', '(' .. int(ls))) do
    local _, e = string.match(member, '^(%d+):(%d+):')
    if tonumber(e) <= ls then redis.call('ZREM', zkey, member) end
  end
end

for _, l in ipairs(p.logstart or {}) do
  local key = base .. ':p:' .. l[1]
  local old = tonumber(redis.call('HGET', key, 'log_start') or '0')
  if l[2] > old then
    redis.call('HSET', key, 'log_start', int(l[2]))
    prune(tostring(l[1]), l[2])
  end
  touch(l[1])
end

for _, s in ipairs(p.segments or {}) do
  local n, b, e = tostring(s[1]), s[2], s[3]
  local ls = tonumber(redis.call('HGET', base .. ':p:' .. n, 'log_start') or '0')
  local zkey = base .. ':seg:' .. n
  -- idempotent by (partition, base_offset): a re-sent or corrected segment replaces the old entry
  redis.call('ZREMRANGEBYSCORE', zkey, int(b), int(b))
  if e > ls then
    redis.call('ZADD', zkey, int(b), string.format('%d:%d:%d:%d:%d', b, e, s[4], s[5], s[6]))
  end
  touch(n)
end

redis.call('HSET', base .. ':applied', stream, int(batch))
local out = {}
for n, _ in pairs(touched) do table.insert(out, n) end
return out
