-- Read-only: how many compaction nudges are sent and not yet answered, over every topic (the controller's
-- compaction.max.concurrent cap, and `compactd explain` saying whether that cap holds a send).
-- KEYS[1] = "<prefix>:{act}:rec" (the action records: "<topic>/<partition>/<action>" -> record JSON)
-- Counted here rather than in Python: only the number leaves Redis, not every compact record. The scan runs inside
-- one script, so nothing writes meanwhile; `seen` still drops a field SCAN returns twice. A record is decoded only
-- when its text contains "sent" at all: most live compact records are pending, and decoding is what costs.
local n, seen, cursor = 0, {}, '0'
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'MATCH', '*/compact', 'COUNT', 1000)
  cursor = page[1]
  local kv = page[2]
  for i = 1, #kv, 2 do
    local slot, raw = kv[i], kv[i + 1]
    if not seen[slot] and string.find(raw, 'sent', 1, true) and cjson.decode(raw).status == 'sent' then
      n = n + 1
    end
    seen[slot] = true
  end
until cursor == '0'
return n
