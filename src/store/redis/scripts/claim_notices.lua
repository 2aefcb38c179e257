local due, all = KEYS[1], KEYS[2]
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])) do
  local json = redis.call('HGET', all, id)
  if json then
    redis.call('ZADD', due, ARGV[2], id)
    out[#out + 1] = json
  else
    redis.call('ZREM', due, id)
  end
end
return out
