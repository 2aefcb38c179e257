local log, cursor, ready_set, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, ttl, oldest = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local i, k = 4, 5
local n = tonumber(ARGV[i]); i = i + 1
local newest = ''
for _ = 1, n do
  redis.call('XACK', log, group, ARGV[i])
  if newer(ARGV[i], newest) then newest = ARGV[i] end
  i = i + 1
end
if n > 0 then
  -- No group (Redis lost it meanwhile): the cursor stays, and these entries are read again.
  local pending_entries = redis.pcall('XPENDING', log, group)
  if type(pending_entries) == 'table' and not pending_entries.err then
    local safe = newest
    if tonumber(pending_entries[1]) > 0 then safe = before(pending_entries[2]) end
    local at = redis.call('GET', cursor) or ''
    if newer(safe, at) then redis.call('SET', cursor, safe) end
  end
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('SET', KEYS[k], ARGV[i], 'EX', ttl)
  local index = KEYS[k + 1]
  redis.call('ZADD', index, ARGV[i + 1], ARGV[i + 2])
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. oldest)
  redis.call('EXPIRE', index, ttl)
  i = i + 3; k = k + 2
end
n = tonumber(ARGV[i]); i = i + 1
local queued = 0
for _ = 1, n do
  local ws, we, id, due, json = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local record, queue, hold, listed = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  i = i + 5; k = k + 4
  if redis.call('SET', record, json, 'NX', 'EX', ttl) then
    redis.call('ZADD', queue, due, id)
    local ready = math.max(tonumber(due), held_until(hold))
    redis.call('ZADD', ready_set, 'LT', string.format('%d', ready), ws .. ' ' .. we)
    redis.call('LPUSH', listed, id)
    redis.call('LTRIM', listed, 0, DELIVERIES_LISTED - 1)
    redis.call('EXPIRE', listed, ttl)
    redis.call('INCR', pending)
    queued = queued + 1
  end
end
return queued
