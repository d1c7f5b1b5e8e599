-- The counted groups' offsets of a topic's partitions, read from the offset buckets (offsets.lua: o:<id>:<bucket>
-- hashes) with one HMGET per (counted group, bucket) of partitions asked. Included by the reads; needs `base`.
-- A partition's minimum is known when every counted group has an offset on it. It used to be kept in a zset per
-- partition (cz:<n>): a third of the state at 1M partitions, a ZADD per partition in each merge and two calls per
-- partition in each read (issue 17); derived here it costs a table lookup per (group, partition) read.
local COUNTED_BUCKET = 128  -- offsets.lua's BUCKET

-- How many groups count on the topic, and the ids of those with offsets (a counted group without an id is assigned
-- to the topic and never committed on it: it makes every partition's minimum unknown).
local function counted_ids()
  local names = redis.call('SMEMBERS', base .. ':counted')
  local ids = {}
  for i = 1, #names, 1000 do
    for _, id in ipairs(redis.call('HMGET', base .. ':gid', unpack(names, i, math.min(i + 999, #names)))) do
      if id then ids[#ids + 1] = id end
    end
  end
  return #names, ids
end

-- The partitions `ns` (strings of partition numbers) by offset bucket: bucket -> its partitions, and the buckets.
local function by_bucket(ns)
  local seen, distinct = {}, {}
  for _, n in ipairs(ns) do
    if not seen[n] then  -- a partition asked twice is read once: its groups are counted once
      seen[n] = true
      distinct[#distinct + 1] = n
    end
  end
  return group_by(distinct, function(n) return math.floor(tonumber(n) / COUNTED_BUCKET) end)
end

-- fn(n, offset, id) for each counted group `id` with an offset on a partition `n` of `ns` (offset: a string; offsets
-- below 2^53 are exact as numbers). One bucket of one group is read whole (HGETALL) when it holds fewer than twice the
-- partitions asked of it, else field by field (HMGET): asking for absent fields was most of a read where groups commit
-- on few partitions of a topic (issue 17: 20 groups each on 1% of a topic's partitions, 5 µs a partition).
local function each_counted_bucket(ids, ns, fn)
  local parts, order = by_bucket(ns)
  for _, b in ipairs(order) do
    local l = parts[b]
    local asked = nil
    for _, id in ipairs(ids) do
      local key = base .. ':o:' .. id .. ':' .. b
      local size = #l > 2 and redis.call('HLEN', key) or nil
      if size and size < 2 * #l then
        if size > 0 then
          if not asked then
            asked = {}
            for i = 1, #l do asked[l[i]] = true end
          end
          local all = redis.call('HGETALL', key)
          for j = 1, #all, 2 do
            if asked[all[j]] then fn(all[j], all[j + 1], id) end
          end
        end
      else
        local vals = redis.call('HMGET', key, unpack(l))
        for i = 1, #l do
          if vals[i] then fn(l[i], vals[i], id) end
        end
      end
    end
  end
end

-- For the partitions `ns`: how many counted groups have an offset on each, and the lowest of those offsets.
local function counted_lowest(ids, ns)
  local count, lowest = {}, {}
  each_counted_bucket(ids, ns, function(n, v)
    local off = tonumber(v)
    count[n] = (count[n] or 0) + 1
    local low = lowest[n]
    if not low or off < low then lowest[n] = off end
  end)
  return count, lowest
end
