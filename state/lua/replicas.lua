-- Every replica's own log as the agents report it (`replica_log` events: the erasure across replicas, policy/rules.py
-- `erasure`, and the local tier `compactd explain` shows), in the topic's :rc hash:
-- field "<n>" = partition n's replica assignment as its latest report gave it, "<replica>,<replica>,...@<ts>";
-- field "<n>:<replica>" = "<cleaned up to>:<seen at>:<ts>:<local log start>" (-1: none; seen at: when a report first
-- gave that checkpoint; ts: the latest report's time). merge.lua writes them (`merge_replicas`), explain_rank.lua
-- reads the cleaners (`replica_cleans`), state/read_store.py `replica_logs` all of it. Include after `base` is set.
local rc_key = base .. ':rc'

local function assignment_of(raw)
  local out = {}
  if raw then
    for r in string.gmatch(string.match(raw, '^([%d,]*)@') or '', '%d+') do out[#out + 1] = r end
  end
  return out
end

-- reports: [[partition, replica, cleaned_up_to (-1: none), local log start (-1), ts, [replica, ...]], ...]. A report
-- older than the one stored for its
-- replica changes nothing (a replay, an agent's late event); a checkpoint that moved, either way (a replica's log is
-- replaced when it is moved back or truncated), is seen at the report's time. The assignment is the latest report's;
-- replicas that left it lose their checkpoint.
local function merge_replicas(reports)
  for _, e in ipairs(reports) do
    local n, rep, cleaned, localstart, ts = tostring(e[1]), tostring(e[2]), e[3], e[4], e[5]
    local field = n .. ':' .. rep
    local old = redis.call('HGET', rc_key, field)
    local oc, oat, ots = nil, nil, -1
    if old then
      local a, b, c = string.match(old, '^(%-?%d+):(%-?%d+):(%d+):')
      oc, oat, ots = tonumber(a), tonumber(b), tonumber(c)
    end
    if ts >= ots then
      local at = ts
      if cleaned < 0 then at = -1 elseif oc == cleaned then at = oat end
      redis.call('HSET', rc_key, field, int(cleaned) .. ':' .. int(at) .. ':' .. int(ts) .. ':' .. int(localstart))
    end
    local sold = redis.call('HGET', rc_key, n)
    local sts = sold and tonumber(string.match(sold, '@(%d+)$')) or -1
    if ts >= sts then
      local now, gone = {}, {}
      for _, r in ipairs(e[6]) do now[int(r)] = true end
      for _, r in ipairs(assignment_of(sold)) do
        if not now[r] then gone[#gone + 1] = n .. ':' .. r end
      end
      if #gone > 0 then redis.call('HDEL', rc_key, unpack(gone)) end
      local listed = {}
      for _, r in ipairs(e[6]) do listed[#listed + 1] = int(r) end
      redis.call('HSET', rc_key, n, table.concat(listed, ',') .. '@' .. int(ts))
    end
  end
end

-- Partitions `ns` (strings, in order) → a flat list, 5 numbers per replica of each one's assignment: its row (0-based
-- index into ns), the replica, its cleaned up to and when that was seen (-1: none), and 1 where an agent reported it
-- (0: in the assignment, never reported); `with_local`: a 6th, its local log start (-1: none). Empty where the topic
-- has no reports (a single broker, agents that report no replicas): one EXISTS.
local function replica_cleans(ns, with_local)
  local out = {}
  if redis.call('EXISTS', rc_key) == 0 then return out end
  for first = 1, #ns, 1000 do
    local last = math.min(first + 999, #ns)
    local sets = redis.call('HMGET', rc_key, unpack(ns, first, last))
    local fields, rows, reps = {}, {}, {}
    for i, raw in ipairs(sets) do
      for _, r in ipairs(assignment_of(raw or nil)) do
        fields[#fields + 1] = ns[first + i - 1] .. ':' .. r
        rows[#rows + 1] = first + i - 2
        reps[#reps + 1] = tonumber(r)
      end
    end
    for at = 1, #fields, 1000 do
      local upto = math.min(at + 999, #fields)
      local vals = redis.call('HMGET', rc_key, unpack(fields, at, upto))
      for j = at, upto do
        local v, c, seen, reported, loc = vals[j - at + 1], -1, -1, 0, -1
        if v then
          local a, b, d = string.match(v, '^(%-?%d+):(%-?%d+):%d+:(%-?%d+)$')
          c, seen, reported, loc = tonumber(a), tonumber(b), 1, tonumber(d)
        end
        local o = #out
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = rows[j], reps[j], c, seen, reported
        if with_local then out[o + 6] = loc end
      end
    end
  end
  return out
end
