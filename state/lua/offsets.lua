-- Shared by merge.lua and recount.lua (included where they say so; they define `base` and `touched`).
-- Redis turns Lua numbers into strings with %.14g; integers are written with %d to keep every digit.
local function int(x) return string.format('%d', x) end

-- What this call already wrote, so a batch touching a partition or a group many times writes its indexes once
-- (issue 17: 100k partitions × 2 groups made six calls per offset, four of them repeats). forget_if_idle clears a
-- group's entries when it removes the group.
local known = {parts = {}, ids = {}, grouped = {}, counted = {}}

local function touch(n)
  n = tostring(n)
  touched[n] = true
  if not known.parts[n] then
    redis.call('SADD', base .. ':parts', n)
    known.parts[n] = true
  end
end

local function touch_all()
  for _, m in ipairs(redis.call('SMEMBERS', base .. ':parts')) do touched[m] = true end
end

-- Offsets are kept small (docs/benchmarks.md, state footprint): each group gets a per-topic integer id (gid hash),
-- its offsets live in hashes of BUCKET partitions each (o:<id>:<bucket>, integer fields and values: Redis' compact
-- listpack encoding), oc counts a group's partitions with an offset and ob remembers its highest bucket. A
-- partition's minimum over the counted groups is read from these buckets (counted.lua).
local BUCKET = 128

local function gid(g, create)
  local id = known.ids[g]
  if id then return id end
  id = redis.call('HGET', base .. ':gid', g)
  if not id and create then
    id = tostring(redis.call('INCR', base .. ':gn'))
    redis.call('HSET', base .. ':gid', g, id)
  end
  if id then known.ids[g] = id end
  return id
end

local function bucket_of(n) return tostring(math.floor(tonumber(n) / BUCKET)) end

-- A group holds the topic back while it has an offset on it OR members assigned to it: an assigned group
-- that never committed has no position, so the minimum is unknown and consumed retention waits.
local function forget_if_idle(g)
  local id = gid(g, false)
  local n = id and tonumber(redis.call('HGET', base .. ':oc', id) or '0') or 0
  if n == 0 and redis.call('SISMEMBER', base .. ':asg', g) == 0 then
    if id then
      redis.call('HDEL', base .. ':oc', id)
      redis.call('HDEL', base .. ':ob', id)
      redis.call('HDEL', base .. ':ct', id)
      redis.call('HDEL', base .. ':gid', g)
    end
    known.ids[g], known.grouped[g], known.counted[g] = nil, nil, nil
    redis.call('SREM', base .. ':groups', g)
    if redis.call('SREM', base .. ':counted', g) == 1 then
      -- the number of counted groups changed: every partition's minimum may now be known/unknown
      touch_all()
    end
  end
end

local function del_offset(g, n)
  n = tostring(n)
  local id = gid(g, false)
  if id then
    if redis.call('HDEL', base .. ':o:' .. id .. ':' .. bucket_of(n), n) == 1 then
      redis.call('HINCRBY', base .. ':oc', id, -1)
    end
    redis.call('HDEL', base .. ':t:' .. id .. ':' .. bucket_of(n), n)  -- its commit time (merge.lua)
  end
  forget_if_idle(g)
  touched[n] = true
end

local function set_offset(g, n, off, counted)
  local id = gid(g, true)
  local b = bucket_of(n)
  if redis.call('HSET', base .. ':o:' .. id .. ':' .. b, n, int(off)) == 1 then
    redis.call('HINCRBY', base .. ':oc', id, 1)
    if tonumber(redis.call('HGET', base .. ':ob', id) or '-1') < tonumber(b) then
      redis.call('HSET', base .. ':ob', id, b)
    end
  end
  if not known.grouped[g] then
    redis.call('SADD', base .. ':groups', g)
    known.grouped[g] = true
  end
  if counted == 1 then
    if not known.counted[g] then
      if redis.call('SADD', base .. ':counted', g) == 1 then touch_all() end
      known.counted[g] = true
    end
  end
  touch(n)
end

-- State written before offsets were bucketed (one `off` hash of "<n>|<group>" fields, gp:<group> sets): moved once,
-- on the topic's first merge or recount with this version (merge.lua, recount.lua).
local function migrate()
  local counted_before = {}
  for _, g in ipairs(redis.call('SMEMBERS', base .. ':counted')) do counted_before[g] = 1 end
  local old = redis.call('HGETALL', base .. ':off')
  for i = 1, #old, 2 do
    local n, g = string.match(old[i], '^(%d+)|(.*)$')
    set_offset(g, n, tonumber(old[i + 1]), counted_before[g] or 0)
  end
  for _, g in ipairs(redis.call('SMEMBERS', base .. ':groups')) do redis.call('DEL', base .. ':gp:' .. g) end
  redis.call('DEL', base .. ':off')
end
if redis.call('EXISTS', base .. ':off') == 1 then migrate() end

