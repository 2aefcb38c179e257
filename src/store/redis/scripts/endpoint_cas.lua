local endpoints, paused, hold, queue, ready = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ws, we = ARGV[1], ARGV[2]
local member = ws .. ' ' .. we
local cur = redis.call('HGET', endpoints, we)
if not cur then return -1 end
if cur ~= ARGV[3] then return 0 end
redis.call('HSET', endpoints, we, ARGV[4])
if ARGV[5] == '1' then
  redis.call('SADD', paused, member)
else
  redis.call('SREM', paused, member)
end
if ARGV[6] == '1' then
  local h = redis.call('HMGET', hold, 'probe', 'tries')
  if redis.call('DEL', hold) == 1 then
    -- The failed delivery waiting for its retry goes now (one out on an attempt, claimed
    -- since, is left to it).
    if h[1] and tonumber(h[2] or '0') == 0 then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      local at = redis.call('ZSCORE', queue, h[1])
      if at and tonumber(at) > now then
        redis.call('ZADD', queue, string.format('%d', now), h[1])
      end
    end
    rescore(ready, hold, member, queue)
  end
end
return 1
