-- Reset ONE topic's log state: the topic was deleted and created again (or its log otherwise is not the one the
-- state describes: policy/identity.py). KEYS[1] = "<prefix>:{<topic>}".
-- Goes: every partition's packed record (segments, log start, cleaner checkpoint), every replica's cleaner
-- checkpoint (:rc), every segment's last leader epoch (:se), every group's offsets on the
-- topic and their commit times, the partition index. Stays: which groups hold the topic (gid, groups, counted,
-- asg): a group that counted still counts, now without a position on any partition, so consumed retention deletes
-- nothing until it commits on the new log (or its offsets are deleted and it stops counting); the applied-batch
-- marks (a replayed batch must still not merge twice). Returns the partitions that had state, for the caller to
-- drop their deadlines and live actions (other slots).
local base = KEYS[1]
local parts = redis.call('SMEMBERS', base .. ':parts')
local buckets = {}
for _, n in ipairs(parts) do buckets[math.floor(tonumber(n) / 128)] = true end  -- part.lua's PART_BUCKET
for b, _ in pairs(buckets) do redis.call('DEL', base .. ':ps:' .. b) end
local ids = redis.call('HGETALL', base .. ':gid')
for i = 2, #ids, 2 do
  local id = ids[i]
  for b = 0, tonumber(redis.call('HGET', base .. ':ob', id) or '-1') do
    redis.call('DEL', base .. ':o:' .. id .. ':' .. b, base .. ':t:' .. id .. ':' .. b)
  end
  redis.call('HSET', base .. ':oc', id, 0)
end
redis.call('DEL', base .. ':ob', base .. ':ct', base .. ':parts', base .. ':rc', base .. ':se')
return parts
