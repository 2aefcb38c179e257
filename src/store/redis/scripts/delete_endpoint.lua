local endpoints, paused, hold, queue, ready = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ws, we = ARGV[1], ARGV[2]
local member = ws .. ' ' .. we
local removed = redis.call('HDEL', endpoints, we)
redis.call('SREM', paused, member)
if redis.call('DEL', hold) == 1 then
  rescore(ready, hold, member, queue)
end
return removed
