-- Merge one micro-batch's changes for ONE topic, atomically and at most once per (stream, batch).
-- Every key shares the topic's hash tag (KEYS[1] = "<prefix>:{<topic>}"), so the script stays on
-- one Redis Cluster slot.
-- ARGV[1] = stream id (the Spark query id: stable across restarts of one checkpoint)
-- ARGV[2] = batch id
-- ARGV[3] = JSON payload:
--   gdel     [group | [group, ts], ...]        groups deleted (all their offsets on this topic go; with the deletion's
--            event time, those committed before it, partition by partition: a newer commit came after it)
--   assign   [[group, assigned(0/1), counted(0/1)], ...]  members assigned to this topic, from group metadata
--   offsets  [[group, counted(0/1), [partition, offset|-1, partition, offset|-1, ...], [partition, commit ts, ...]],
--            ...]   -1 = offset deleted (one flat list per group: decoding 100k small lists was most of the script's
--            time); the commit times where the commits topic gives them (absent or empty: none)
--   committs [[group, latest commit ts], ...]  per group on this topic (the ct hash, for `compactd explain`)
--   compacted [[partition, cleaned_up_to, ts], ...]   ts: when the agent saw the clean (may be absent: unknown)
--   replicas  [[partition, replica, cleaned_up_to, ts, [replica, ...]], ...]   every replica's cleaner (replicas.lua)
--   logstart  [[partition, log_start_offset], ...]
--   segments  [[partition, base, end, first_batch_max_ts, size, closed_at], ...]
-- Returns the touched partitions (space-separated), or -1 when this batch was already applied (replay).
local base = KEYS[1]
local stream, batch = ARGV[1], tonumber(ARGV[2])
local applied = redis.call('HGET', base .. ':applied', stream)
if applied and tonumber(applied) >= batch then
  return -1
end
local p = cjson.decode(ARGV[3])
local touched = {}
--! include offsets.lua
--! include part.lua
--! include replicas.lua
migrate_parts()

-- A group's deletion takes every offset of the group on the topic; with the deletion's event time (the JSON commits
-- topic, where a deletion and the commits sit in different partitions, read in any order) only those whose commit is
-- older, partition by partition: a commit at or after it (a tie: the safe side) is the group back there, and stays.
-- An offset without a commit time of its own (stored by a build that kept none) is judged by the group's latest
-- commit time on the topic: newer than the deletion, it may be the newer one, and stays (the group holds).
for _, e in ipairs(p.gdel or {}) do
  local g, at = e, nil
  if type(e) == 'table' then g, at = e[1], e[2] end
  local id = gid(g, false)
  local kept = 0
  if id then
    local latest = tonumber(redis.call('HGET', base .. ':ct', id) or '-1')
    for b = 0, tonumber(redis.call('HGET', base .. ':ob', id) or '-1') do
      local key, tkey = base .. ':o:' .. id .. ':' .. b, base .. ':t:' .. id .. ':' .. b
      local times = {}
      if at then
        local flat = redis.call('HGETALL', tkey)
        for i = 1, #flat, 2 do times[flat[i]] = tonumber(flat[i + 1]) end
      end
      local gone = {}
      for _, n in ipairs(redis.call('HKEYS', key)) do
        if at and (times[n] or latest) >= at then
          kept = kept + 1
        else
          gone[#gone + 1] = n
          touched[n] = true
        end
      end
      if #gone > 0 then  -- at most 128 partitions a bucket
        redis.call('HDEL', key, unpack(gone))
        redis.call('HDEL', tkey, unpack(gone))
      end
    end
    redis.call('HSET', base .. ':oc', id, kept)
  end
  if kept == 0 then
    redis.call('SREM', base .. ':asg', g)
    forget_if_idle(g)
  end
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

-- Offsets: deleted ones first, one by one (rare: a group's offset tombstone); then the set ones in bulk, as one HSET
-- per (group, bucket) and one SADD of partitions per thousand (issue 17: one call per offset
-- and index was most of a 100k-partition batch). Entries are distinct (group, partition) pairs, so the order between
-- them changes no offset; a group a delete leaves idle is forgotten first and gets a new id if it is set again.
for _, grp in ipairs(p.offsets or {}) do
  local g, flat = grp[1], grp[3]
  for i = 1, #flat, 2 do
    if flat[i + 1] < 0 then del_offset(g, tostring(flat[i])) end
  end
end
local buckets, bucket_order, new_parts = {}, {}, {}

-- A partition the batch names: touched, and indexed once (one SADD per thousand new ones, at the end).
local function touch_later(n)
  touched[n] = true
  if not known.parts[n] then
    known.parts[n] = true
    new_parts[#new_parts + 1] = n
  end
end

for _, grp in ipairs(p.offsets or {}) do
  local g, counted, flat = grp[1], grp[2], grp[3]
  for i = 1, #flat, 2 do
    local n, off = tostring(flat[i]), flat[i + 1]
    if off >= 0 then
      local id = gid(g, true)
      local b = bucket_of(n)
      local key = base .. ':o:' .. id .. ':' .. b
      local bk = buckets[key]
      if not bk then
        bk = {id = id, b = tonumber(b), fields = {}}
        buckets[key] = bk
        bucket_order[#bucket_order + 1] = key
      end
      bk.fields[#bk.fields + 1] = n
      bk.fields[#bk.fields + 1] = int(off)
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
      touch_later(n)
    end
  end
end
-- The commit times the commits topic gives (`offsets`' fourth item: partition, time, ...), per partition beside the
-- offsets (t:<id>:<bucket>): a group's deletion read later is ordered against each.
for _, grp in ipairs(p.offsets or {}) do
  local times = grp[4]
  if times and #times > 0 then
    local id = gid(grp[1], true)
    local fields, order = {}, {}
    for i = 1, #times, 2 do
      local key = base .. ':t:' .. id .. ':' .. bucket_of(times[i])
      if not fields[key] then
        fields[key] = {}
        order[#order + 1] = key
      end
      local f = fields[key]
      f[#f + 1] = tostring(times[i])
      f[#f + 1] = int(times[i + 1])
    end
    for _, key in ipairs(order) do redis.call('HSET', key, unpack(fields[key])) end
  end
end
local highest = {}
for _, key in ipairs(bucket_order) do
  local bk = buckets[key]
  local added = redis.call('HSET', key, unpack(bk.fields))  -- at most 128 partitions a bucket: 256 arguments
  if added > 0 then
    redis.call('HINCRBY', base .. ':oc', bk.id, added)
    if bk.b > (highest[bk.id] or -1) then highest[bk.id] = bk.b end
  end
end
for id, b in pairs(highest) do
  if tonumber(redis.call('HGET', base .. ':ob', id) or '-1') < b then redis.call('HSET', base .. ':ob', id, b) end
end

-- a group's latest commit time on the topic, by its id: an integer hash (listpack), one field per (group, topic)
for _, c in ipairs(p.committs or {}) do
  local id = gid(c[1], false)
  if id and c[2] > tonumber(redis.call('HGET', base .. ':ct', id) or '-1') then
    redis.call('HSET', base .. ':ct', id, int(c[2]))
  end
end

-- Partition records (part.lua): those the batch changes read at once (one HMGET per bucket), changed in memory, and
-- written at the end (one HSET per bucket): a call per segment event to read, index and write its partition was
-- most of the merge of a batch naming 90k partitions (issue 17).
local records, changed = {}, {}
do
  local need, seen = {}, {}
  for _, list in ipairs({p.compacted or {}, p.logstart or {}, p.segments or {}}) do
    for _, c in ipairs(list) do
      local n = tostring(c[1])
      if not seen[n] then
        seen[n] = true
        need[#need + 1] = n
      end
    end
  end
  records = read_parts(need)
  for n, r in pairs(records) do r.n = n end
end
local function record(n) return records[tostring(n)] end
local function mark(r)
  if not r.changed then
    r.changed = true
    changed[#changed + 1] = r.n
  end
end

-- A clean's time comes with the cleaned_up_to it moved to, and moves only with it: a re-sent event (the agent's full
-- re-announce, a replay) or an older one changes neither. A record whose time is unknown (written before compactd
-- kept it, or by an older build) takes the first time given for the cleaned_up_to it holds.
for _, c in ipairs(p.compacted or {}) do
  local r = record(c[1])
  local at = type(c[3]) == 'number' and c[3] or nil
  if c[2] > r.cleaned then
    r.cleaned, r.cleaned_at = c[2], at
    mark(r)
  elseif c[2] == r.cleaned and at and not r.cleaned_at then
    r.cleaned_at = at
    mark(r)
  end
  touch_later(tostring(c[1]))
end

-- Replicas' cleaners: the erasure bound reads them, nothing decides by them (the partition's `cleaned` is the
-- leader's, from `compacted`)
merge_replicas(p.replicas or {})
for _, e in ipairs(p.replicas or {}) do touch_later(tostring(e[1])) end

-- Each segment's last leader epoch (`segment_rolled`'s `last_epoch`, where the agent gave one), in the topic's :se
-- hash by "<partition>:<base>": the send-time check of a delete reads it (control/dispatch.py). Kept as long as the
-- segment is, written and deleted in two calls at the end.
local epochs_set, epochs_gone = {}, {}

for _, l in ipairs(p.logstart or {}) do
  local r = record(l[1])
  if l[2] > r.log_start then
    r.log_start = l[2]
    -- drop segments wholly below the log start: they are gone from disk
    local kept = {}
    for _, s in ipairs(r.segs) do
      if s[2] > l[2] then kept[#kept + 1] = s else epochs_gone[#epochs_gone + 1] = r.n .. ':' .. s[1] end
    end
    r.segs = kept
    mark(r)
  end
  touch_later(tostring(l[1]))
end

-- Segments, idempotent by (partition, base_offset): a re-sent or corrected segment replaces the stored one, a later
-- event of the batch an earlier one, and one that ends at or below the log start only removes it. Per partition the
-- batch's segments are merged with the record's at once (one at a time was quadratic in the segments a partition
-- got in one batch); the common case, one segment after the last one kept, is an append.
local incoming, seg_order = {}, {}
for _, s in ipairs(p.segments or {}) do
  local n = tostring(s[1])
  local by_base = incoming[n]
  if not by_base then
    by_base = {count = 0, last = nil, segs = {}}
    incoming[n] = by_base
    seg_order[#seg_order + 1] = n
  end
  if not by_base.segs[s[2]] then by_base.count = by_base.count + 1 end
  by_base.segs[s[2]] = s
  by_base.last = s
  touch_later(n)
end
for _, n in ipairs(seg_order) do
  local r = record(n)
  local new = incoming[n]
  local tail = r.segs[#r.segs]
  local s = new.last
  if new.count == 1 and (tail == nil or s[2] > tail[1]) then
    if s[3] > r.log_start then r.segs[#r.segs + 1] = {s[2], s[3], s[4], s[5], s[6]} end
  else
    local kept = {}
    for _, old in ipairs(r.segs) do
      if not new.segs[old[1]] then kept[#kept + 1] = old end
    end
    for b, e in pairs(new.segs) do
      if e[3] > r.log_start then kept[#kept + 1] = {b, e[3], e[4], e[5], e[6]} end
    end
    if #kept > 1 then table.sort(kept, function(x, y) return x[1] < y[1] end) end
    r.segs = kept
  end
  for b, e in pairs(new.segs) do  -- a segment replaced without an epoch keeps none: never an older log's
    local field = n .. ':' .. b
    if e[3] > r.log_start and type(e[7]) == 'number' and e[7] >= 0 then
      epochs_set[#epochs_set + 1] = field
      epochs_set[#epochs_set + 1] = int(e[7])
    else
      epochs_gone[#epochs_gone + 1] = field
    end
  end
  mark(r)
end
for i = 1, #epochs_gone, 1000 do  -- first: a segment the log start dropped may come back in this batch's reports
  redis.call('HDEL', base .. ':se', unpack(epochs_gone, i, math.min(i + 999, #epochs_gone)))
end
for i = 1, #epochs_set, 1000 do
  redis.call('HSET', base .. ':se', unpack(epochs_set, i, math.min(i + 999, #epochs_set)))
end

do
  local by_bucket, order = group_by(changed, part_key)
  for _, k in ipairs(order) do
    local fields = {}
    for _, n in ipairs(by_bucket[k]) do
      fields[#fields + 1] = n
      fields[#fields + 1] = encode_part(records[n])
    end
    redis.call('HSET', k, unpack(fields))  -- at most 128 partitions a bucket: 256 arguments
  end
end
for i = 1, #new_parts, 1000 do
  redis.call('SADD', base .. ':parts', unpack(new_parts, i, math.min(i + 999, #new_parts)))
end

redis.call('HSET', base .. ':applied', stream, int(batch))
local out = {}
for n, _ in pairs(touched) do out[#out + 1] = n end
return table.concat(out, ' ')  -- one string: a reply of 100k strings costs the client more to parse
