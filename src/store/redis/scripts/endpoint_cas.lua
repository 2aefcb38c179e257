local p, ws, we = ARGV[1], ARGV[2], ARGV[3]
local endpoints, member = p .. ':endpoints:' .. ws, ws .. ' ' .. we
local cur = redis.call('HGET', endpoints, we)
if not cur then return -1 end
if cur ~= ARGV[4] then return 0 end
redis.call('HSET', endpoints, we, ARGV[5])
if ARGV[6] == '1' then
  redis.call('SADD', p .. ':wh:paused', member)
else
  redis.call('SREM', p .. ':wh:paused', member)
end
if ARGV[7] == '1' then
  local hold, queue = p .. ':wh:hold:' .. we, p .. ':wh:due:' .. we
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
    rescore(p, member, queue, we)
  end
end
return 1
