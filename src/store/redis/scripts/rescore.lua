-- Shared Lua: `held_until(hold)` is when an endpoint held back by a failure (its hold key) may
-- be tried again (0: not held); `rescore(ready, hold, member, queue)` recomputes an endpoint's
-- place in the ready set from its queue and its hold; `is_active(raw)` tells whether an endpoint's JSON reads and says it is
-- active.
local function is_active(raw)
  if not raw then return false end
  local ok, e = pcall(cjson.decode, raw)
  return ok and type(e) == 'table' and e.status == 'active'
end
local function held_until(hold)
  return tonumber(redis.call('HGET', hold, 'until') or '0')
end
local function rescore(ready, hold, member, queue)
  local first = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', ready, member)
  else
    local score = math.max(tonumber(first[2]), held_until(hold))
    redis.call('ZADD', ready, string.format('%d', score), member)
  end
end
