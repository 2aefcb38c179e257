local p, group, ttl, oldest = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local i = 5
local n = tonumber(ARGV[i]); i = i + 1
local newest = ''
for _ = 1, n do
  redis.call('XACK', KEYS[1], group, ARGV[i])
  if newer(ARGV[i], newest) then newest = ARGV[i] end
  i = i + 1
end
if n > 0 then
  -- No group (Redis lost it meanwhile): the cursor stays, and these entries are read again.
  local pending = redis.pcall('XPENDING', KEYS[1], group)
  if type(pending) == 'table' and not pending.err then
    local safe = newest
    if tonumber(pending[1]) > 0 then safe = before(pending[2]) end
    local cursor = redis.call('GET', p .. ':wh:cursor') or ''
    if newer(safe, cursor) then redis.call('SET', p .. ':wh:cursor', safe) end
  end
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('SET', ARGV[i], ARGV[i + 1], 'EX', ttl)
  local index = ARGV[i + 2]
  redis.call('ZADD', index, ARGV[i + 3], ARGV[i + 4])
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. oldest)
  redis.call('EXPIRE', index, ttl)
  i = i + 5
end
n = tonumber(ARGV[i]); i = i + 1
local queued = 0
for _ = 1, n do
  local ws, we, id, due, json = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  i = i + 5
  if redis.call('SET', p .. ':wh:dlv:' .. id, json, 'NX', 'EX', ttl) then
    redis.call('ZADD', p .. ':wh:due:' .. we, due, id)
    local ready = math.max(tonumber(due), held_until(p .. ':wh:hold:' .. we))
    redis.call('ZADD', p .. ':wh:ready', 'LT', string.format('%d', ready), ws .. ' ' .. we)
    local log = p .. ':wh:log:' .. we
    redis.call('LPUSH', log, id)
    redis.call('LTRIM', log, 0, DELIVERIES_LISTED - 1)
    redis.call('EXPIRE', log, ttl)
    redis.call('INCR', p .. ':wh:pending')
    queued = queued + 1
  end
end
return queued
